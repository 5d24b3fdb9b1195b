"""Detection, the first layer of the pipeline: what machine is this?

system_view.py is the one read-only view of a machine (live or a snapshot directory);
parsers/ turn each vendor tool's output into records (pure); evidence.py gathers them;
detect.py merges them into physical GPUs, the primary GPU and the target. snapshot.py
copies what detection and the doctor read into a directory for a bug report.
Imports only the package's foundation modules (errors, archs, model, boundedio, ...).
"""
