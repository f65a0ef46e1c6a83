"""The launcher behind `bash awm_grpo/run_awm_grpo.sh`: knobs, their resolution, the training job.

    knobs.py      every knob (key, environment variable, target) and the profiles' defaults: data only
    config.py     resolution and precedence (CLI > env > config file > profile), the knob table
    job.py        prerequisites, the runtime YAML, slime's command, the run (`python -m awm_grpo.launch`)
    disk.py       the disk budget printed at start: one save, the run's peak, free space; the refusal
    processes.py  the launcher's children, stopped by recorded id only
"""
