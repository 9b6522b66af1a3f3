"""gmi_drl.telemetry"""
