"""`gptrain megatron`: Megatron-LM's pretrain_gpt.py flags, translated to gptrain's config."""
