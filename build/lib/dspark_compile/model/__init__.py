from dspark_compile.model.drafter import Drafter

__all__ = ["Drafter"]
