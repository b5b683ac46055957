"""kopf handlers: thin wrappers that hand every KVCalibration to services.reconciler.Reconciler."""
