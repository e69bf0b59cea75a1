"""Hugging Face config.json files as the models' pages give them, trimmed to the keys the
planner reads: the planner's presets must come out of them (tests/test_plan.py), and the planner
page must read them as the Python does (tests/test_explorer.py)."""

HF_CONFIGS = {
    "llama3-8b": {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                  "tie_word_embeddings": False},
    "mixtral-8x7b": {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": False},
    "qwen2.5-7b": {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
                   "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
                   "tie_word_embeddings": False},
    "bloom-176b": {"model_type": "bloom", "hidden_size": 14336, "n_layer": 70, "n_head": 112, "vocab_size": 250880},
    "opt-175b": {"model_type": "opt", "hidden_size": 12288, "num_hidden_layers": 96, "num_attention_heads": 96,
                 "ffn_dim": 49152, "vocab_size": 50272, "max_position_embeddings": 2048},
    "deepseek-v3": {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
                    "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512,
                    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280,
                    "tie_word_embeddings": False},
}
