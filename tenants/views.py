"""Discovery documents (RFC 9728, RFC 8414) and the token endpoint's resource handling (RFC 8707)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from oauth2_provider.models import get_grant_model
from oauth2_provider.views import OAuthServerMetadataView, TokenView

from tenants import conf
from tenants import conf as tenant_conf
from tenants.conf import (
    MCP_SCOPES,
    TENANT_SEGMENT,
    canonical_resource,
    normalize_uri,
    public_origin,
    resource_tenant,
    tenant_resource,
)
from tenants.models import ExternalIssuer, Tenant


def _request_resource(request: HttpRequest) -> str:
    """The canonical resource URI as seen from this request (PUBLIC_URL wins when set)."""
    return canonical_resource(request.build_absolute_uri(tenant_conf.get().MCP_PATH))


@require_GET
def protected_resource_metadata(request: HttpRequest, resource_path: str | None = None) -> HttpResponse:
    """RFC 9728 Protected Resource Metadata of the MCP endpoint or of one tenant's endpoint.

    Served at ``/.well-known/oauth-protected-resource`` and at the path-inserted form for the
    MCP path (``/.well-known/oauth-protected-resource/mcp``); a tenant's endpoint
    (``…/mcp/t/<slug>``) has its own document listing only that tenant's identity providers.
    Other paths, and unknown or disabled tenants, are 404.
    """
    resource = _request_resource(request)
    issuers = ExternalIssuer.objects.filter(active=True, tenant__active=True)
    if resource_path is not None:
        wanted = resource_path.strip("/")
        mcp_path = tenant_conf.get().MCP_PATH.strip("/")
        from urllib.parse import urlsplit

        slug = resource_tenant("/" + wanted)
        if slug is not None and wanted == f"{mcp_path}/{TENANT_SEGMENT}/{slug}":
            if not Tenant.objects.filter(slug=slug, active=True).exists():
                raise Http404("No protected resource at this path")
            resource = tenant_resource(resource, slug)
            issuers = issuers.filter(tenant__slug=slug)
        elif wanted not in (mcp_path, urlsplit(resource).path.strip("/")):
            raise Http404("No protected resource at this path")
    servers: list[str] = []
    if conf.get().BUILTIN_AS:
        servers.append(public_origin(resource))
    for issuer in issuers.order_by("issuer").values_list("issuer", flat=True).distinct():
        if issuer not in servers:
            servers.append(issuer)
    data: dict[str, Any] = {
        "resource": resource,
        "authorization_servers": servers,
        "scopes_supported": list(MCP_SCOPES),
        "bearer_methods_supported": ["header"],
        "resource_name": "mcptasks MCP server",
    }
    response = JsonResponse(data)
    response["Access-Control-Allow-Origin"] = "*"
    response["Cache-Control"] = "max-age=300"
    return response


class AuthorizationServerMetadataView(OAuthServerMetadataView):
    """RFC 8414 metadata of the built-in authorization server (django-oauth-toolkit)."""

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """The DOT document, 404 when the built-in AS is disabled."""
        if not conf.get().BUILTIN_AS:
            raise Http404("The built-in authorization server is disabled")
        return super().get(request, *args, **kwargs)


def _invalid_target(description: str) -> HttpResponse:
    return JsonResponse({"error": "invalid_target", "error_description": description}, status=400)


class ResourceTokenView(TokenView):
    """DOT's token endpoint, pinned to this server's resource (RFC 8707).

    A ``resource`` parameter must name this server's canonical MCP resource URI (anything
    else: 400 ``invalid_target``). Without one, the canonical URI is filled in (for an
    authorization code only if the authorization request did not already name one), so
    every token the built-in AS issues is audience-restricted to this server.
    """

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """Check/fill ``resource``, then let DOT issue the token."""
        canonical = _request_resource(request)
        params = request.POST.copy()
        resources = [r for r in params.getlist("resource") if r.strip()]
        if resources:
            wanted = []
            for r in resources:
                target = normalize_uri(r)
                slug = resource_tenant(target)
                # This server's endpoint, or one tenant's own endpoint (a token is usable
                # there only if its client belongs to that tenant).
                if target != canonical and not (slug and target == tenant_resource(canonical, slug)):
                    return _invalid_target(f"This authorization server only issues tokens for {canonical}")
                wanted.append(target)
            params.setlist("resource", wanted)
        else:
            grant_type = params.get("grant_type", "")
            needs_default = grant_type == "client_credentials"
            if grant_type == "authorization_code":
                granted = (
                    get_grant_model()
                    .objects.filter(code=params.get("code", ""))
                    .values_list("resource", flat=True)
                    .first()
                )
                needs_default = not granted
            if needs_default:
                params.setlist("resource", [canonical])
        request.POST = params  # type: ignore[assignment]
        return super().post(request, *args, **kwargs)
