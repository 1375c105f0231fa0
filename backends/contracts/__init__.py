"""What every layer agrees on, importing nothing else from `backends`: the stage messages
(`messages`: one dataclass per Triton request or response) and their tensor codec
(`tensor_codec`), where a stage delivers results (`sink`), how a request fails (`errors`), and
how the orchestrator calls the stages (`stage_clients`: the stage names, the `StageClients`
protocol and `StageCallError`).
"""
