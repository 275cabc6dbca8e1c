"""pyinfra roles (`@deploy()` functions) behind deploys/*.py."""
