"""Running models: named activation points, the activation cache and edits (`runner`), and where
each family's heads and MLPs live (`sites`). See `workbench.running.runner`."""

from workbench.running.runner import ActivationCache, ModelRunner, Run, stack_names  # noqa: F401
