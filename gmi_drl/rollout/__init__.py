"""gmi_drl.rollout"""
