"""The Slurm backend's spawner, its part of the line: a part of the spawner.

:class:`SlurmLineSpawner` is mixed into :class:`hub_ext.slurm.spawner.GPUSlurmSpawner`, as
:class:`hub_ext.docker.spawner_line.LineSpawner` is into the Docker spawner.  What it does:

- before the job is submitted, no GPU of the profile free and no wait asked: refused at
  once (HTTP 409), in the words of the spawn page's card;
- while Slurm keeps the job pending, the job is a place in the hub's line
  (:class:`hub_ext.line.Line`, Slurm's queue as its backend: :mod:`.line`); the progress
  page shows the place's sentence, updated live; the member may leave the line, an admin
  remove the place, and it expires after ``c.Line.max_wait``, as on the single node;
- after a hub restart, the line's keeper starts the spawn again and it takes the pending
  job back by its id (same place in Slurm's queue), handing it the new API token through a
  file of the member's (the job's environment was fixed at submission).
"""

from __future__ import annotations

import asyncio

from tornado import web
from traitlets.config import LoggingConfigurable

from ..common import metrics
from ..common.clock import now
from ..line import LineRefused
from .cluster import SUBMIT_HOST_MESSAGE, SlurmUnavailable, member_prefix, parse_gres_request
from .line import attach_line
from .submit import CommandFailed, SubmitHostUnavailable

__all__ = ["SlurmLineSpawner"]


class SlurmLineSpawner(LoggingConfigurable):
    """The line, the refusal when no GPU is free, and a pending job taken back."""

    wait_requested = False

    def line(self):
        """The hub's line, with Slurm's queue as its backend (:mod:`.line`)."""
        return attach_line(self)

    def check_free_gpus(self, nodes, reservations=()) -> None:
        """No node of the profile's partition with its GPUs free (``nodes``: sinfo, just
        read) and no wait asked: refused at once (HTTP 409) in the words of its spawn page
        card (:func:`hub_ext.slurm.availability.gpus_in`).  A member who asked to wait
        goes on to the queue, unless no node could ever hold the request; so does a
        start whose place was kept from before a hub restart.  GPUs of a Slurm
        reservation of a group the member is not in (``reservations``) count as taken
        (:meth:`hub_ext.slurm.availability.SlurmAvailability.as_member_sees`).  Slurm
        may still keep a job pending that found a GPU free here (another start took it
        first): it is then a place in line."""
        kind, count = parse_gres_request(self.req_gres)
        if not count or self.server_key in self.line().places:
            return
        gpus = self.as_member_sees(
            nodes, reservations, kind, count, self.req_partition or self.cluster.default_partition
        )
        if not gpus.refusal or (self.wait_requested and gpus.can_wait):
            return
        metrics.SPAWNS_REFUSED.labels(reason="no_gpu_free").inc()
        self.log.warning(
            "Refusing spawn of %s (no_gpu_free, gres %s, partition %s): %s",
            self._log_name,
            self.req_gres,
            self.req_partition or "default",
            gpus.refusal,
        )
        raise web.HTTPError(409, gpus.refusal)

    def token_file(self) -> str:
        """Where the job finds the API token of this start (in the member's workspace)."""
        workspace = self.workspace.format(username=self.user.name)
        return f"{workspace}/.gpuhub/token-{self.name or 'default'}"

    async def hand_token(self) -> None:
        """Leave this start's API token where the job reads it when it runs (mode 0600,
        deleted by the job), so that a job kept from before a hub restart runs with the
        token JupyterHub holds now.  Written as the member (``exec_prefix``), on the submit
        host when there is one: the hub never writes as root in a folder the member owns.
        Raises HTTPError(503) when the submit host does not answer, HTTPError(500) when
        the write fails."""
        argv = [
            *member_prefix(self.exec_prefix, self.user.name),
            "sh",
            "-c",
            'umask 077 && cat > "$1"',
            "sh",
            self.token_file(),
        ]
        try:
            await self.submit.run(
                argv, input=(self.api_token or "").encode(), timeout=self.scheduler_timeout * 10
            )
        except SubmitHostUnavailable as e:
            self.log.error("Could not write the token file of %s: %s", self._log_name, e)
            raise web.HTTPError(503, SUBMIT_HOST_MESSAGE) from None
        except (CommandFailed, OSError, TimeoutError) as e:
            self.log.error("Could not write the token file of %s: %s", self._log_name, e)
            raise web.HTTPError(
                500, "Your server could not be prepared on the cluster. Ask an admin."
            ) from None

    async def take_back_job(self) -> bool:
        """Before a submission: this server's job left by a hub that stopped during the
        start (found by its name and owner, and by the id spawner state kept, if any).
        A pending one is taken back (True: ``self.job_id`` is its id; its place in
        Slurm's queue stays); any other (one that ran while the hub was down, with a
        token JupyterHub no longer honours) is cancelled.  The new API token is handed
        first (:meth:`hand_token`), so a job that starts meanwhile reads it."""
        await self.hand_token()
        state = getattr(getattr(self, "orm_spawner", None), "state", None) or {}
        known = str(state.get("job_id") or "")
        try:
            jobs = await self.line().backend.read(fresh=True)
        except SlurmUnavailable as e:
            self.log.warning("Cannot look for the earlier job of %s: %s", self._log_name, e)
            return False
        mine = [
            j
            for j in jobs.values()
            if (j.user, j.name) == (self.user.name, self.job_name)
            and j.state not in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT")
        ]
        pending = sorted(
            (j for j in mine if j.state == "PENDING"), key=lambda j: j.job_id != known
        )  # the id kept in state first
        kept = pending[0] if pending else None
        for job in mine:
            if job is not kept:
                self.log.warning(
                    "%s: cancelling job %s (%s), left by a hub that stopped during its start",
                    self._log_name,
                    job.job_id,
                    job.state,
                )
                try:
                    await self.cluster.run("scancel", job.job_id)
                except SlurmUnavailable:
                    self.log.exception("Could not cancel job %s", job.job_id)
        if kept is None:
            return False
        self.job_id = kept.job_id
        self.persist_state()
        self.log.info(
            "%s takes back job %s, pending since before the hub restarted",
            self._log_name,
            kept.job_id,
        )
        self.emit(15, f"Your job {kept.job_id} kept its place in the cluster's queue")
        return True

    # -- the place ---------------------------------------------------------------------

    async def _report_place(self) -> None:
        """A pending job is a place in the hub's line: joined once Slurm has looked at the
        job and kept it waiting (its reason is no longer "None"; the queue is first read
        ``line_poll_interval`` seconds after the submission); its sentence on the
        progress page whenever it changes.  Raises HTTPError(409) when the place ended
        (the member left, an admin removed it, it expired: ``c.Line.max_wait``) or may
        not be taken (one place per member and profile)."""
        line = self.line()
        key = self.server_key
        if key not in line.places and asyncio.get_running_loop().time() < getattr(
            self, "_line_from", 0.0
        ):
            return  # just submitted: most jobs run before the queue is worth a read
        try:
            job = (await line.backend.read()).get(self.job_id)
        except SlurmUnavailable as e:
            self.log.warning("No place in line for %s: %s", self._log_name, e)
            return
        place = line.places.get(key)
        if place is None:
            if job is None or job.state != "PENDING" or job.reason == "None":
                return
            kind, count = parse_gres_request(self.req_gres)
            try:
                place = await line.join(
                    key,
                    profile=self.profile_slug,
                    profile_name=self.profile_name or "this server",
                    units="gpu",
                    count=count,
                    user_options=dict(self.user_options or {}),
                )
            except LineRefused as e:
                metrics.SPAWNS_REFUSED.labels(reason=e.reason).inc()
                raise web.HTTPError(409, e.message) from None
            self.log.info(
                "%s waits in line: job %s pending (%s)", self._log_name, self.job_id, job.reason
            )
        line.backend.track(key, self.job_id)
        if place.waiter is None:  # this start's place (a new one, or kept from before)
            place.waiter = asyncio.get_running_loop().create_future()
            place.on_update = self._show_place
            self._show_place(line.describe(key))
        if not place.waiter.done() and now() > place.queued_at + line.max_wait:
            line.remove(
                key,
                "expired",
                f"Your place in line for {place.profile_name} "
                f"expired: no GPU freed within {line.max_wait / 60:g} min. "
                "Try again later or pick another profile.",
            )
        if place.waiter.done():
            left = place.waiter.exception()
            metrics.SPAWNS_REFUSED.labels(reason=f"line_{getattr(left, 'reason', 'left')}").inc()
            raise web.HTTPError(409, getattr(left, "message", "Your place in line ended."))

    def _show_place(self, place: dict) -> None:
        """A waiting start's place on the progress page (only when it changed)."""
        sentence = place.get("sentence")
        last = self._events[-1]["message"] if self._events else ""
        if sentence and sentence != last:
            self.emit(20, sentence)
