"""Knowledge distillation: the KL-temperature loss and the teacher/student compatibility check.
Never imports the pipeline or stage layers.
"""
