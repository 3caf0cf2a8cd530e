"""Taking a model out of the workbench: a run's weights as a Hugging Face model folder, a PEFT
adapter folder or a merged model (``exporter.export_run``), streamed one parameter group at a
time, written atomically, with a model card.

    source.py          which weights of a run directory (``RUN_DIR/weights``, a checkpoint)
    pending.py         a checkpoint's pending ZO update applied per group, as the run's flush
    safetensors_stream.py / folder.py   shards written a tensor at a time; the atomic folder
    tokenizer_files.py the tokenizer's files (the tiny presets' byte tokenizer included)
    peft_folder.py     adapter keys and config, the merge
    card.py            README.md in the Hub's form
"""
