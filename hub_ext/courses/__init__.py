"""Courses: a course's students (a JupyterHub group), its instructors (identity-provider
groups with a role limited to that group) and its credit account.  Docs: how-to
"Set up a course in five minutes" and reference/rest-api.

- :mod:`.courses`: ``GPUHUB_COURSES``, read and checked (:func:`load_courses`);
- :mod:`.hubconfig`: the instructors' roles and the grant scope (``apply_courses_config``);
- :mod:`.handlers`: ``POST /hub/api/gpuhub/courses/<slug>/grants``.
"""

from .courses import Course, load_courses

__all__ = ["Course", "load_courses"]
