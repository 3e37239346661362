"""The store's tables, one module per group (app/core/store.Store composes them over one connection)."""
