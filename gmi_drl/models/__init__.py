"""gmi_drl.models"""
