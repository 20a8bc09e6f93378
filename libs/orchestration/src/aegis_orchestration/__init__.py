"""AEGIS orchestration, pure: job models, condition DSL, parameters, planning, ASL."""
