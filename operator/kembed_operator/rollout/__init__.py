"""kembed.operator.rollout: the rollout state machine as pure functions: the observed world and the plan
(`world`), a candidate's gate (`gate`), stepwise rollouts (`stepwise`), the status conditions
(`conditions`), the Jobs' outcomes (`job_results`) and golden records (`golden`), decided in one
place (`rollout`).

It reads and returns records; it never calls the API.
"""
