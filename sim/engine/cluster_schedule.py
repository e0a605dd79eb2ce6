"""A layer's FFN phase of neuron clusters, scheduled by a compiled event loop.

PowerInfer-2's decode runs a layer's CPU clusters through a pipeline (Gate read, Gate
compute, Up/Down read, Up/Down compute) on a pool of compute threads and one I/O thread,
while the NPU computes the hot neurons [PI2 §4-5]. Nothing else uses those resources
during the phase, so the phase is a closed system: its schedule can be computed in one
call and the simpy model advanced by the phase's length (one event instead of about
sixty per layer). This module is that call. It follows the rules of the per-cluster simpy
processes in :mod:`sim.engine.strategies.powerinfer2` (which remain the reference, used
for timelines and by the tests that compare both):

- clusters start in their order (resident first) and each stage waits in a FIFO queue
  for its resource; the thread pool hands out the fastest free core first;
- a compute job's DRAM bandwidth is fixed when it starts: the CPU's figure (shared with
  the NPU while the NPU job runs) split max-min fairly over the demands of the jobs
  already running and its own (:func:`sim.hw.dram.water_fill`);
- a read takes its bytes at the single I/O thread's throughput, plus the storage latency
  only if it finds the I/O thread idle: a read that waited in the I/O queue starts the
  instant the one before ends, its commands already in UFS's command queue, so its
  latency hides behind that transfer (as :meth:`sim.hw.flash.FlashModel.batch_time_s`
  with ``back_to_back`` and :meth:`sim.engine.machine.Machine.read` charge it).

Events at one instant are handled in the order simpy handles them (everything ending
then releases its resource, waiters are served first come first served, then the clusters
whose stage ended ask for the next, in scheduling order), so the bandwidth shares and the
schedule come out as the processes' do: ``tests/engine/test_engine_speedups.py`` runs both
and requires bit-identical per-token latencies (and every other figure to 1e-9).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_READ, _JOB, _NPU = 0, 1, 2
# Slots of the event loop's integer state array.
_SIZE, _SEQ, _IO_IDLE, _CPU_HEAD, _CPU_TAIL, _IO_HEAD, _IO_TAIL, _RUNNING, _NPU_ON = range(9)


@njit(cache=True)
def _water_share(total, demands, n):
    """The last of ``demands[:n]``'s max-min fair share of ``total`` (as water_fill does)."""
    s = 0.0
    for i in range(n):
        s += demands[i]
    if s <= total:
        return demands[n - 1]
    # Stable sort of indices by demand (n is at most the thread count).
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        j = i
        while j > 0 and demands[order[j - 1]] > demands[i]:
            order[j] = order[j - 1]
            j -= 1
        order[j] = i
    remaining = total
    for k in range(n):
        i = order[k]
        share = min(demands[i], remaining / (n - k))
        if i == n - 1:
            return share
        remaining -= share
    return 0.0


@njit(cache=True, inline="always")
def _earlier(times, seqs, a, b):
    """Event ``a`` comes before event ``b``: earlier time, then earlier scheduling (simpy's rule)."""
    return times[a] < times[b] or (times[a] == times[b] and seqs[a] < seqs[b])


@njit(cache=True, inline="always")
def _swap(times, seqs, kinds, ids, a, b):
    times[a], times[b] = times[b], times[a]
    seqs[a], seqs[b] = seqs[b], seqs[a]
    kinds[a], kinds[b] = kinds[b], kinds[a]
    ids[a], ids[b] = ids[b], ids[a]


@njit(cache=True)
def _push(times, seqs, kinds, ids, st, t, kind, ident):
    """Schedule an event (a binary heap over four parallel arrays). Callers pass ``kind`` as an
    int64: a module constant would reach numba as a literal, one compilation per kind."""
    i = st[_SIZE]
    st[_SIZE] = i + 1
    times[i] = t
    seqs[i] = st[_SEQ]
    st[_SEQ] += 1
    kinds[i] = kind
    ids[i] = ident
    while i > 0:
        p = (i - 1) // 2
        if _earlier(times, seqs, p, i):
            break
        _swap(times, seqs, kinds, ids, p, i)
        i = p


@njit(cache=True)
def _pop(times, seqs, kinds, ids, st):
    t, kind, ident = times[0], kinds[0], ids[0]
    size = st[_SIZE] - 1
    st[_SIZE] = size
    _swap(times, seqs, kinds, ids, 0, size)
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and _earlier(times, seqs, c + 1, c):
            c += 1
        if _earlier(times, seqs, i, c):
            break
        _swap(times, seqs, kinds, ids, i, c)
        i = c
    return t, kind, ident


@njit(cache=True)
def schedule_ffn_phase(now, gate_reads, ud_reads, job_bytes, job_ops, has_ud, thread_rate, thread_mem,
                       cpu_gbps_alone, cpu_gbps_with_npu, npu_end, latency_s, gate_block, gate_gbps, ud_block,
                       ud_gbps, thread_busy, io_busy):
    """End time of the phase that starts at ``now``; adds busy seconds to the outputs.

    Per cluster ``c``: ``gate_reads[c]``/``ud_reads[c]`` reads, ``job_bytes[c, 0|1]`` and
    ``job_ops[c, 0|1]`` of its Gate and Up/Down jobs (the second only if ``has_ud[c]``).
    Threads are indexed fastest first (the pool's order). ``npu_end`` is when the NPU's job
    ends (``now`` if there is none). ``io_busy[0]`` gets the I/O thread's busy time.
    """
    n_clusters = gate_reads.shape[0]
    n_threads = thread_rate.shape[0]
    stage = np.zeros(n_clusters, dtype=np.int64)  # next stage: 0 gate read .. 3 up/down compute, 4 done
    thread_free = np.ones(n_threads, dtype=np.bool_)
    run_thread = np.empty(n_threads, dtype=np.int64)  # running jobs' threads, in start order
    run_demand = np.empty(n_threads + 1, dtype=np.float64)
    wait_cpu = np.empty(2 * n_clusters, dtype=np.int64)  # FIFO queues: each cluster joins each at most twice
    wait_io = np.empty(2 * n_clusters, dtype=np.int64)
    cap = n_clusters + 1  # each cluster has at most one event outstanding, plus the NPU's
    heap_t = np.empty(cap, dtype=np.float64)
    heap_s = np.empty(cap, dtype=np.int64)
    heap_k = np.empty(cap, dtype=np.int64)
    heap_i = np.empty(cap, dtype=np.int64)
    st = np.zeros(9, dtype=np.int64)
    st[_IO_IDLE] = 1
    rates = np.array([cpu_gbps_alone, cpu_gbps_with_npu])
    reads = np.array([gate_block, gate_gbps, ud_block, ud_gbps, latency_s])
    end = now
    if npu_end > now:
        _push(heap_t, heap_s, heap_k, heap_i, st, npu_end, np.int64(_NPU), np.int64(-1))
        st[_NPU_ON] = 1
    for c in range(n_clusters):  # every cluster starts at once, in order
        _advance(c, now, stage, gate_reads, ud_reads, has_ud, job_bytes, job_ops, thread_rate, thread_mem, rates,
                 reads, thread_free, run_thread, run_demand, wait_cpu, wait_io, thread_busy, io_busy, heap_t, heap_s,
                 heap_k, heap_i, st)
    done = np.empty(n_clusters, dtype=np.int64)
    while st[_SIZE] > 0:
        # Everything that ends at this instant lets go of its resources first; then the
        # waiting clusters take them (first come, first served; fastest core first); then
        # the clusters whose stage ended ask for their next one, in the order their events
        # were scheduled. This is the order simpy serves a store's waiters and resumes
        # processes at one instant, so bandwidth shares come out the same.
        now = heap_t[0]
        end = max(end, now)
        n_done = 0
        while st[_SIZE] > 0 and heap_t[0] == now:
            _, kind, ident = _pop(heap_t, heap_s, heap_k, heap_i, st)
            if kind == _NPU:
                st[_NPU_ON] = 0
            elif kind == _READ:
                st[_IO_IDLE] = 1
                done[n_done] = ident
                n_done += 1
            else:  # a compute job: ident = cluster * n_threads + thread
                th = ident % n_threads
                thread_free[th] = True
                j = 0
                while run_thread[j] != th:
                    j += 1
                n = st[_RUNNING]
                for k in range(j, n - 1):
                    run_thread[k] = run_thread[k + 1]
                    run_demand[k] = run_demand[k + 1]
                st[_RUNNING] = n - 1
                done[n_done] = ident // n_threads
                n_done += 1
        if st[_IO_IDLE] and st[_IO_HEAD] < st[_IO_TAIL]:  # the I/O thread takes the next queued read
            w = wait_io[st[_IO_HEAD]]
            st[_IO_HEAD] += 1
            st[_IO_IDLE] = 0
            _start_read(w, stage[w], now, np.int64(1), gate_reads, ud_reads, reads, io_busy, heap_t, heap_s, heap_k,
                        heap_i, st)
        while st[_CPU_HEAD] < st[_CPU_TAIL]:  # waiting clusters take the freed threads
            th = _fastest_free(thread_free)
            if th < 0:
                break
            w = wait_cpu[st[_CPU_HEAD]]
            st[_CPU_HEAD] += 1
            _start_job(w, stage[w], th, now, job_bytes, job_ops, thread_rate, thread_mem, rates, thread_free,
                       run_thread, run_demand, thread_busy, heap_t, heap_s, heap_k, heap_i, st)
        for k in range(n_done):
            c = done[k]
            stage[c] += 1
            _advance(c, now, stage, gate_reads, ud_reads, has_ud, job_bytes, job_ops, thread_rate, thread_mem, rates,
                     reads, thread_free, run_thread, run_demand, wait_cpu, wait_io, thread_busy, io_busy, heap_t,
                     heap_s, heap_k, heap_i, st)
    return end


@njit(cache=True)
def _advance(c, now, stage, gate_reads, ud_reads, has_ud, job_bytes, job_ops, thread_rate, thread_mem, rates, reads,
             thread_free, run_thread, run_demand, wait_cpu, wait_io, thread_busy, io_busy, heap_t, heap_s, heap_k,
             heap_i, st):
    """Cluster ``c`` asks for its next stage's resource, skipping stages with nothing to do."""
    while stage[c] < 4:
        s = stage[c]
        if s == 0 or s == 2:
            if (gate_reads[c] if s == 0 else ud_reads[c]) == 0:
                stage[c] = s + 1
                continue
            if st[_IO_IDLE] and st[_IO_HEAD] == st[_IO_TAIL]:
                st[_IO_IDLE] = 0
                _start_read(c, s, now, np.int64(0), gate_reads, ud_reads, reads, io_busy, heap_t, heap_s, heap_k,
                            heap_i, st)
            else:
                wait_io[st[_IO_TAIL]] = c
                st[_IO_TAIL] += 1
            return
        if s == 3 and not has_ud[c]:
            stage[c] = 4
            return
        th = _fastest_free(thread_free) if st[_CPU_HEAD] == st[_CPU_TAIL] else -1
        if th < 0:
            wait_cpu[st[_CPU_TAIL]] = c
            st[_CPU_TAIL] += 1
        else:
            _start_job(c, s, th, now, job_bytes, job_ops, thread_rate, thread_mem, rates, thread_free, run_thread,
                       run_demand, thread_busy, heap_t, heap_s, heap_k, heap_i, st)
        return


@njit(cache=True)
def _fastest_free(thread_free):
    for k in range(thread_free.shape[0]):
        if thread_free[k]:
            return k
    return -1


@njit(cache=True)
def _start_read(c, s, now, queued, gate_reads, ud_reads, reads, io_busy, heap_t, heap_s, heap_k, heap_i, st):
    """Start cluster ``c``'s read stage ``s`` on the I/O thread. ``queued`` (1, else 0): it waited
    behind the read that just ended, so it runs back-to-back and its latency is hidden (the same
    arithmetic as ``FlashModel.batch_time_s``, so both paths agree to the bit). Callers pass it as
    an int64: a ``True``/``False`` literal would reach numba as two literal types, two compilations."""
    n_req = gate_reads[c] if s == 0 else ud_reads[c]
    block = reads[0] if s == 0 else reads[2]
    gbps = reads[1] if s == 0 else reads[3]
    transfer = n_req * block / (gbps * 1e9)
    d = transfer if queued else reads[4] + transfer
    io_busy[0] += d
    _push(heap_t, heap_s, heap_k, heap_i, st, now + d, np.int64(_READ), c)


@njit(cache=True)
def _start_job(c, s, th, now, job_bytes, job_ops, thread_rate, thread_mem, rates, thread_free, run_thread,
               run_demand, thread_busy, heap_t, heap_s, heap_k, heap_i, st):
    """Start cluster ``c``'s compute stage ``s`` on thread ``th``."""
    part = 0 if s == 1 else 1
    wb = job_bytes[c, part]
    ops = job_ops[c, part]
    rate = thread_rate[th]
    n = st[_RUNNING]
    run_demand[n] = thread_mem[th] if ops <= 0 else min(thread_mem[th], rate * wb / ops)
    bw = _water_share(rates[1] if st[_NPU_ON] else rates[0], run_demand, n + 1)
    run_thread[n] = th
    st[_RUNNING] = n + 1
    thread_free[th] = False
    if wb <= 0 and ops <= 0:
        d = 0.0
    else:
        memory_s = wb / (bw * 1e9) if wb > 0 else 0.0
        d = max(memory_s, ops / (rate * 1e9))
    thread_busy[th] += d
    _push(heap_t, heap_s, heap_k, heap_i, st, now + d, np.int64(_JOB), c * thread_rate.shape[0] + th)


@njit(cache=True)
def schedule_token(now, attention_s, predictor_s, head_s, npu_s, bounds, gate_reads, ud_reads, job_bytes, job_ops,
                   has_ud, thread_rate, thread_mem, cpu_gbps_alone, cpu_gbps_with_npu, latency_s, gate_block,
                   gate_gbps, ud_block, ud_gbps, thread_busy, layer_out):
    """A whole decode token in a closed stretch (nothing else runs): per layer the attention
    and predictor barrier phases (``attention_s``/``predictor_s`` on every compute thread),
    then the FFN phase of :func:`schedule_ffn_phase` with the NPU's job of ``npu_s[l]``
    seconds (none when 0) and clusters ``bounds[l]:bounds[l + 1]``; then the LM head.

    The clock advances by the same float additions the per-phase path makes, and
    ``thread_busy`` (the compute threads' running totals, fastest first) gets the same
    additions in the same order, so both paths agree to the bit. Per layer ``layer_out``
    gets [attention, predictor and FFN seconds, I/O-thread busy seconds, FFN bytes]. Returns
    the time the token ends.
    """
    n_threads = thread_rate.shape[0]
    busy = np.zeros(n_threads)
    io_busy = np.zeros(1)
    for layer in range(bounds.shape[0] - 1):
        t0 = now
        now = now + attention_s
        for th in range(n_threads):
            thread_busy[th] += attention_s
        t1 = now
        now = now + predictor_s
        for th in range(n_threads):
            thread_busy[th] += predictor_s
        t2 = now
        npu_end = now + npu_s[layer] if npu_s[layer] > 0.0 else now
        lo = bounds[layer]
        hi = bounds[layer + 1]
        busy[:] = 0.0
        io_busy[0] = 0.0
        end = schedule_ffn_phase(now, gate_reads[lo:hi], ud_reads[lo:hi], job_bytes[lo:hi], job_ops[lo:hi],
                                 has_ud[lo:hi], thread_rate, thread_mem, cpu_gbps_alone, cpu_gbps_with_npu, npu_end,
                                 latency_s, gate_block, gate_gbps, ud_block, ud_gbps, busy, io_busy)
        for th in range(n_threads):
            if busy[th] != 0.0:
                thread_busy[th] += busy[th]
        ffn_bytes = 0.0
        for c in range(lo, hi):
            ffn_bytes += job_bytes[c, 0]
            if has_ud[c]:
                ffn_bytes += job_bytes[c, 1]
        now = end
        layer_out[layer, 0] = t1 - t0
        layer_out[layer, 1] = t2 - t1
        layer_out[layer, 2] = end - t2
        layer_out[layer, 3] = io_busy[0]
        layer_out[layer, 4] = ffn_bytes
    t3 = now
    now = now + head_s
    for th in range(n_threads):
        thread_busy[th] += head_s
    return now, now - t3
