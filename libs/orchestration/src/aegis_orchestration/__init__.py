"""AEGIS orchestration (seed 003), pure: job models, condition DSL, parameters, planning, ASL."""
