// Drives one mcptasks task end to end with the official TypeScript SDK's experimental tasks
// client and prints a JSON summary on stdout (read by tests/e2e/test_sdk_typescript.py).
//
// usage: node drive.mjs <mcp-url> [question]
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema, ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const [url, question = 'Favourite colour?'] = process.argv.slice(2);
const summary = { messages: [], elicitations: [], notifications: [] };

const client = new Client(
  { name: 'mcptasks-ts-e2e', version: '1.0.0' },
  { capabilities: { elicitation: { form: {} } } },
);
// The server asks through elicitation/create on the tasks/result stream; answer it.
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  summary.elicitations.push(request.params);
  return { action: 'accept', content: { answer: 'teal' } };
});
client.fallbackNotificationHandler = async (notification) => {
  summary.notifications.push(notification.method);
};

const transport = new StreamableHTTPClientTransport(new URL(url));
await client.connect(transport);
summary.protocolVersion = transport.protocolVersion;
summary.serverTasks = client.getServerCapabilities()?.tasks ?? null;

const stream = client.experimental.tasks.callToolStream(
  { name: 'demo_ask', arguments: { question } },
  CallToolResultSchema,
  { task: { ttl: 60000 } },
);
for await (const message of stream) {
  if (message.type === 'taskCreated') {
    summary.taskId = message.task.taskId;
    summary.messages.push({ type: message.type, status: message.task.status });
  } else if (message.type === 'taskStatus') {
    summary.messages.push({ type: message.type, status: message.task.status });
  } else if (message.type === 'result') {
    summary.messages.push({ type: message.type });
    summary.result = message.result;
  } else if (message.type === 'error') {
    summary.messages.push({ type: message.type, error: String(message.error) });
  }
}
summary.finalStatus = (await client.experimental.tasks.getTask(summary.taskId)).status;
await transport.terminateSession();
await client.close();
process.stdout.write(JSON.stringify(summary) + '\n');
