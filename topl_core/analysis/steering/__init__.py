"""LoRA-B steering: the mode registry (modes), steering vectors (vectors), the hooks that apply them (hooks), a
merged model kept for steering (session), llama.cpp control-vector export (control_vector), fluency of texts."""
