"""A plan-sized tiny GPT (mock data, float32, no dropout) shared by the planner's CLI and Slurm tests."""

TINY = [
    "model.num_layers=2",
    "model.hidden_size=32",
    "model.num_attention_heads=4",
    "model.encoder_seq_length=32",
    "model.data.seq_length=32",
    "model.max_position_embeddings=32",
    "model.global_batch_size=4",
    "model.data.mock_vocab_size=100",
    "model.hidden_dropout=0",
    "model.attention_dropout=0",
    "trainer.precision=32",
]
