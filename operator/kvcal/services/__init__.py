"""Services: orchestrate the pure core and the adapters (observe -> decide -> act)."""
