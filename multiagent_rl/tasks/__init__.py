"""Tasks: what an episode is played on (``Task``, ``TaskData``), the first stage of the data flow."""

from .task import Task, TaskData

__all__ = ["Task", "TaskData"]
