"""BERTology workbench: train small models of the classic pretrained families and probe them layer by layer."""

__version__ = "0.1.0"
