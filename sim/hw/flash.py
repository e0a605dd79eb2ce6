"""Flash storage service times: request size, access pattern, address span, issuing core.

The model is physical and uses only the device profile:

- the device delivers ``rand_read(size)`` (or ``seq_read(size)``) GB/s at full queue,
  interpolated in log-log space between measured points;
- random reads spread over a larger span run slower (``range_effect``, [PI2 §2.3]);
- the CPU core that issues the reads runs the UFS driver, so it can issue at most
  ``io_4k_gbps / 4 KiB`` requests per second [PI2 §2.3: big 1076, mid 1008, little 762 MB/s];
- a batch of ``n`` requests costs one request latency (filling the queue) plus its bytes
  at the resulting throughput, so small batches cannot hide latency; a batch issued
  back-to-back (its issuer had it queued behind the batch before, so its commands sit in
  the command queue while that one transfers) costs only its transfer: the queue never
  drains between them, so its latency hides behind the previous batch's data;
- a command queue holds at most ``queue_depth`` requests, each in flight for a latency
  plus its transfer, so by Little's law a queue moves at most ``queue_depth x size /
  (latency + size / rate)``: at queue depth 1 a 4 KiB random read is latency-bound (tens
  of MB/s), at the bundled profiles' depth of 32 the measured curves are the limit;
- UFS has one command queue: several issuing cores contend and lose up to
  ``multi_issuer_penalty`` of the throughput [PI2 §2.3].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.hw.curves import linlog_interp, loglog_interp
from sim.profiles.device import CpuCluster, DeviceProfile


@dataclass
class FlashModel:
    """Service-time functions of one device's storage (no simpy: shared by DES and analytic)."""

    device: DeviceProfile
    extrapolated: set[str] = field(default_factory=set)
    _parallel_memo: dict[tuple, float] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        st = self.device.storage
        self._seq = ([p.block for p in st.seq_read], [p.gbps for p in st.seq_read])
        self._rand = ([p.block for p in st.rand_read], [p.gbps for p in st.rand_read])
        self._range = ([p.span for p in st.range_effect], [p.factor for p in st.range_effect])
        self.page_bytes = st.page_bytes
        self.latency_s = st.read_latency_us * 1e-6
        self.queue_depth = st.queue_depth
        self.peak_gbps = max(max(self._seq[1]), max(self._rand[1]))

    def device_gbps(self, block_bytes: int, sequential: bool = False, span_bytes: int | None = None) -> float:
        """What the device alone sustains for requests of this size at full queue."""
        xs, ys = self._seq if sequential else self._rand
        gbps, extra = loglog_interp(block_bytes, xs, ys)
        if extra:
            self.extrapolated.add(f"storage {'sequential' if sequential else 'random'} read of "
                                  f"{block_bytes} B outside measured {xs[0]}-{xs[-1]} B")
        if not sequential and span_bytes is not None and self._range[0]:
            factor, _ = linlog_interp(span_bytes, *self._range)
            gbps *= factor
        return gbps

    def issuer_gbps(self, block_bytes: int, core: CpuCluster) -> float:
        """Throughput the issuing core's driver work allows (requests/s times size)."""
        return core.io_4k_gbps * 1e9 / 4096 * block_bytes / 1e9

    def queue_gbps(self, block_bytes: int, device_gbps: float, queues: int = 1) -> float:
        """What ``queues`` command queues of ``queue_depth`` entries allow (Little's law): each
        request stays in flight for a latency plus its transfer at the device's rate."""
        in_flight = self.queue_depth * min(queues, self.device.storage.command_queues)
        return in_flight * block_bytes / (self.latency_s + block_bytes / (device_gbps * 1e9)) / 1e9

    def throughput_gbps(self, block_bytes: int, core: CpuCluster, *, sequential: bool = False,
                        span_bytes: int | None = None, n_issuers: int = 1) -> float:
        device = self.device_gbps(block_bytes, sequential, span_bytes)
        # one issuing thread submits to one command queue
        gbps = min(device, self.issuer_gbps(block_bytes, core), self.queue_gbps(block_bytes, device))
        return gbps * self.contention(n_issuers)

    def contention(self, n_issuers: int) -> float:
        """The share of throughput left when ``n_issuers`` cores issue at once ([PI2 §2.3]: up to
        ``multi_issuer_penalty`` is lost on UFS's single command queue). With several queues
        (NVMe) the issuers spread over them and only those sharing a queue contend, so more
        queues never cost throughput."""
        per_queue = n_issuers / self.device.storage.command_queues
        if per_queue <= 1:
            return 1.0
        return 1.0 - self.device.storage.multi_issuer_penalty * (1.0 - 1.0 / per_queue)

    def batch_time_s(self, n_requests: int, block_bytes: int, core: CpuCluster, *, sequential: bool = False,
                     span_bytes: int | None = None, n_issuers: int = 1, back_to_back: bool = False) -> float:
        """Time to serve ``n_requests`` reads of ``block_bytes`` issued together by ``core``.

        ``back_to_back``: the batch starts the instant the one before it on the same queue
        ends, having waited behind it (PowerInfer-2's single I/O thread with more reads
        pending). Its commands were queued during that transfer (UFS keeps ``queue_depth``
        of them), so the device never idles and the batch costs only its transfer; a batch
        that finds the device idle pays the latency to fill the queue first.
        """
        if n_requests <= 0:
            return 0.0
        gbps = self.throughput_gbps(block_bytes, core, sequential=sequential, span_bytes=span_bytes,
                                    n_issuers=n_issuers)
        transfer = n_requests * block_bytes / (gbps * 1e9)
        return transfer if back_to_back else self.latency_s + transfer

    def parallel_throughput_gbps(self, block_bytes: int, threads: Sequence[CpuCluster], *, sequential: bool = False,
                                 span_bytes: int | None = None, blocking: bool = True,
                                 other_issuers: int = 0) -> float:
        """Throughput of reads split over several issuing threads (LLM in a Flash's 32 threads).

        - the driver work spreads over the distinct cores the threads run on: per cluster at
          most ``cores`` threads issue at once, each at its core's ``io_4k_gbps`` rate;
        - those cores (plus ``other_issuers`` issuing elsewhere) contend for the single UFS
          command queue and lose ``multi_issuer_penalty`` as for several single issuers;
        - ``blocking`` threads (``pread``, page faults) keep one request in flight each, so
          by Little's law they sustain at most ``threads x block / (latency + block / device
          rate)``, which is how a lone blocking reader is latency-bound.
        """
        if not threads:
            raise ValueError("a parallel read needs at least one issuing thread")
        key = (block_bytes, tuple(c.name for c in threads), sequential, span_bytes, blocking, other_issuers)
        if key not in self._parallel_memo:  # asked for every batch; the combinations are few
            self._parallel_memo[key] = self._parallel_throughput(block_bytes, threads, sequential, span_bytes,
                                                                 blocking, other_issuers)
        return self._parallel_memo[key]

    def _parallel_throughput(self, block_bytes: int, threads: Sequence[CpuCluster], sequential: bool,
                             span_bytes: int | None, blocking: bool, other_issuers: int) -> float:
        device = self.device_gbps(block_bytes, sequential, span_bytes)
        used = _cores_used(threads)
        issuing = sum(n for _, n in used)
        gbps = min(device, sum(n * self.issuer_gbps(block_bytes, core) for core, n in used),
                   self.queue_gbps(block_bytes, device, queues=issuing))  # a queue per issuing core at most
        if blocking:
            per_thread = block_bytes / (self.latency_s + block_bytes / (device * 1e9)) / 1e9
            gbps = min(gbps, len(threads) * per_thread)
        return gbps * self.contention(issuing + other_issuers)

    def parallel_batch_time_s(self, n_requests: int, block_bytes: int, threads: Sequence[CpuCluster], *,
                              sequential: bool = False, span_bytes: int | None = None, blocking: bool = True,
                              other_issuers: int = 0) -> float:
        """Time to serve ``n_requests`` reads of ``block_bytes`` split over ``threads``."""
        if n_requests <= 0:
            return 0.0
        gbps = self.parallel_throughput_gbps(block_bytes, threads, sequential=sequential, span_bytes=span_bytes,
                                             blocking=blocking, other_issuers=other_issuers)
        return self.latency_s + n_requests * block_bytes / (gbps * 1e9)

    @staticmethod
    def issuing_cores(threads: Sequence[CpuCluster]) -> int:
        """Distinct cores a set of issuing threads occupies (threads beyond a cluster's cores share)."""
        return sum(n for _, n in _cores_used(threads))


def _cores_used(threads: Sequence[CpuCluster]) -> list[tuple[CpuCluster, int]]:
    """Per cluster the threads run on: (cluster, cores they keep busy, at most its core count)."""
    counts: dict[str, tuple[CpuCluster, int]] = {}
    for core in threads:
        c, n = counts.get(core.name, (core, 0))
        counts[core.name] = (c, n + 1)
    return [(c, min(n, c.cores)) for c, n in counts.values()]
