"""gmi_drl.algos"""
