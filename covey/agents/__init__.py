"""The agents: one file per algorithm over a small shared base."""
