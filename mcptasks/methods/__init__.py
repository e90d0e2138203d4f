"""The method tables of both protocol eras and what they share; they return replies, never write HTTP."""
