"""Logging for training and evaluation: the metrics sinks, rank-0 console helpers and the progress bar."""

from deepspec_train.logging_utils.metrics_sink import (
    FanoutSink,
    JsonlSink,
    MetricsSink,
    NoOpSink,
    WandbSink,
    get_logger,
    get_rank,
    is_main_process,
    make_sink,
    rank0_print,
    speak_for_role,
)
from deepspec_train.logging_utils.progress import TrainProgress

__all__ = [
    "FanoutSink",
    "JsonlSink",
    "MetricsSink",
    "NoOpSink",
    "TrainProgress",
    "WandbSink",
    "get_logger",
    "get_rank",
    "is_main_process",
    "make_sink",
    "rank0_print",
    "speak_for_role",
]
