"""fleet-reconciler: desired state, drift reports and safe converges for a lobes mesh."""

__version__ = "0.1.0"
