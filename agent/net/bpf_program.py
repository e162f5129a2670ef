"""The eBPF programs gpuscope loads, as C text for bcc.

INVARIANT: these programs read only tracepoint arguments (`args->...`), BPF helpers and
uapi types (`struct __sk_buff`, `struct bpf_sock`). They never dereference a kernel
struct. Tracepoint argument layouts come from tracefs at load time, so the programs
compile against any kernel header tree that has the BPF helper definitions: that is what
lets gpuscope run on hosts with no headers matching their kernel (the image carries a
generic tree). The test `test_probes_compile_and_load_against_two_header_trees` (in
test_net_kernel.py) proves it by compiling and loading these programs against two different
header trees. Do not add `#include`s of kernel-internal headers or `sk->field` reads here.

Everything is aggregated in the kernel, keyed by cgroup id; nothing is streamed per event.
Maps are bounded; a failed insert is counted in `map_full` (index = MAP_INDEX), never silent.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.agent.net.records import DIRECTIONS, PROTOCOLS, RTT_SLOTS

# The retired map's value: bytes and calls per protocol and direction, the TCP counters,
# then the RTT histogram (agent/net/probes.py names them).
RETIRED_FIELDS = 2 * len(PROTOCOLS) * len(DIRECTIONS) + 5 + RTT_SLOTS

# Order of the map_full array slots; user space names them in gpuscope_bpf_map_full_total.
MAP_INDEX = ("traffic", "sockets", "tcp", "rtt")


@dataclass(frozen=True, slots=True)
class MapLimits:
    """Upper bounds on entries; sized for a busy node (110 pods, host services, 100k sockets)."""

    cgroups: int = 8192
    sockets: int = 262144

    @property
    def traffic(self) -> int:
        return self.cgroups * len(PROTOCOLS) * len(DIRECTIONS)

    @property
    def rtt(self) -> int:
        return self.cgroups * 16  # a cgroup's RTTs rarely span more than 16 octaves


_COMMON = r"""
#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define MSG_PEEK 2
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_SYN_RECV 3
#define TCP_CLOSE 7
#define SOCK_ESTABLISHED 1     /* counted as opened (it reached ESTABLISHED after we started) */
#define SOCK_PENDING_PASSIVE 2 /* accepted in softirq; owner known at its first send/recv */
#define RTT_SLOTS __RTT_SLOTS__
#define RTT_SAMPLE_JIFFIES 1 /* at most one RTT observation per socket per kernel tick */

struct traffic_key { u64 cgroup; u32 proto; u32 dir; };
struct traffic_val { u64 bytes; u64 calls; };
struct sock_val { u64 cgroup; u64 rtt_at; u32 flags; u32 pad; };
struct tcp_val { u64 opened; u64 closed; u64 retransmits; u64 rtt_sum_us; u64 rtt_count; };
struct rtt_key { u64 cgroup; u64 slot; };

/* Per-CPU, so the hot path adds without atomic instructions; allocated on insert, so a
 * many-CPU node pays for the entries it uses, not for the map's capacity. */
BPF_F_TABLE("percpu_hash", struct traffic_key, struct traffic_val, traffic, __MAX_TRAFFIC__,
            BPF_F_NO_PREALLOC);
BPF_HASH(tcp, u64, struct tcp_val, __MAX_CGROUPS__);
BPF_ARRAY(map_full, u64, 4);

/* Written and read by user space only: what the agent has summed from cgroups that are gone,
 * per pod, so a pod's counters survive an agent restart as the live maps do. */
struct retired_key { char pod_uid[40]; char container[72]; };
struct retired_val { u64 v[__RETIRED_FIELDS__]; };
BPF_F_TABLE("hash", struct retired_key, struct retired_val, retired, __MAX_CGROUPS__,
            BPF_F_NO_PREALLOC);

static __always_inline void count_full(int which) {
    u64 *v = map_full.lookup(&which);
    if (v)
        __sync_fetch_and_add(v, 1);
}

static __always_inline void add_traffic(u64 cgroup, u32 proto, u32 dir, u64 bytes) {
    struct traffic_key k = {};
    k.cgroup = cgroup;
    k.proto = proto;
    k.dir = dir;
    struct traffic_val zero = {};
    struct traffic_val *v = traffic.lookup_or_try_init(&k, &zero);
    if (!v) {
        count_full(0);
        return;
    }
    v->bytes += bytes;
    v->calls += 1;
}

static __always_inline struct tcp_val *tcp_stats(u64 cgroup) {
    struct tcp_val zero = {};
    struct tcp_val *v = tcp.lookup_or_try_init(&cgroup, &zero);
    if (!v)
        count_full(2);
    return v;
}
"""

_SOCKETS = r"""
#define GPUSCOPE_SOCKETS 1
BPF_HASH(sockets, u64, struct sock_val, __MAX_SOCKETS__);

/* The hot paths (every send, receive and received segment) first check a per-CPU memo of
 * the socket they saw last, skipping the hash lookup when nothing can have changed. The
 * epoch moves whenever a socket's entry is created or removed, which invalidates every
 * CPU's memo at once: a freed socket's address reused by a new one never hits a stale memo.
 * Softirq work for a socket often runs on its peer's CPU, hence a memo per probe. */
struct sock_memo { u64 sk; u64 cgroup; u64 epoch; u64 rtt_at; };
BPF_PERCPU_ARRAY(memo, struct sock_memo, 2); /* [0] send/receive, [1] tcp_probe */
BPF_ARRAY(epoch, u64, 1);

static __always_inline u64 current_epoch(void) {
    int zero = 0;
    u64 *e = epoch.lookup(&zero);
    return e ? *e : 0;
}

static __always_inline void bump_epoch(void) {
    int zero = 0;
    u64 *e = epoch.lookup(&zero);
    if (e)
        __sync_fetch_and_add(e, 1);
}

static __always_inline void opened(u64 cgroup) {
    struct tcp_val *v = tcp_stats(cgroup);
    if (v)
        __sync_fetch_and_add(&v->opened, 1);
}

static __always_inline void closed(u64 cgroup) {
    struct tcp_val *v = tcp_stats(cgroup);
    if (v)
        __sync_fetch_and_add(&v->closed, 1);
}

/* Process context: remember which cgroup owns this TCP socket, for the probes that fire in
 * softirq/timer context where the current task is unrelated (retransmit, RTT, close). */
static __always_inline void remember(u64 sk, u64 cgroup) {
    int zero = 0;
    u64 now_epoch = current_epoch();
    struct sock_memo *m = memo.lookup(&zero);
    if (m && m->sk == sk && m->cgroup == cgroup && m->epoch == now_epoch)
        return; /* seen on this CPU, owned by this cgroup, nothing changed since */
    if (m) {
        m->sk = sk;
        m->cgroup = cgroup;
        m->epoch = now_epoch;
        m->rtt_at = 0;
    }
    struct sock_val *s = sockets.lookup(&sk);
    if (s) {
        if (s->flags & SOCK_PENDING_PASSIVE) {
            s->flags &= ~SOCK_PENDING_PASSIVE;
            s->cgroup = cgroup;
            opened(cgroup);
        } else if (s->cgroup != cgroup) {
            s->cgroup = cgroup; /* handed to another process (fd passing) */
        }
        return;
    }
    struct sock_val n = {};
    n.cgroup = cgroup;
    if (sockets.update(&sk, &n) != 0)
        count_full(1);
    bump_epoch();
}

TRACEPOINT_PROBE(sock, inet_sock_set_state) {
    if (args->protocol != IPPROTO_TCP)
        return 0;
    u64 sk = (u64)args->skaddr;
    int newstate = args->newstate;
    if (newstate == TCP_SYN_SENT) {
        /* connect(): process context, so the current cgroup is the socket's owner. */
        struct sock_val n = {};
        n.cgroup = bpf_get_current_cgroup_id();
        if (sockets.update(&sk, &n) != 0)
            count_full(1);
        bump_epoch();
        return 0;
    }
    if (newstate == TCP_ESTABLISHED) {
        if (args->oldstate == TCP_SYN_SENT) {
            /* Active open completes in softirq: use the owner saved at connect(). */
            struct sock_val *s = sockets.lookup(&sk);
            if (s && !(s->flags & SOCK_ESTABLISHED)) {
                s->flags |= SOCK_ESTABLISHED;
                opened(s->cgroup);
            }
        } else if (args->oldstate == TCP_SYN_RECV) {
            /* Passive open: the accepting process is not known yet. */
            struct sock_val n = {};
            n.flags = SOCK_ESTABLISHED | SOCK_PENDING_PASSIVE;
            if (sockets.update(&sk, &n) != 0)
                count_full(1);
            bump_epoch();
        }
        return 0;
    }
    if (newstate == TCP_CLOSE) {
        struct sock_val *s = sockets.lookup(&sk);
        if (s) {
            if (s->flags & SOCK_PENDING_PASSIVE) {
                opened(0); /* accepted and closed before any process touched it */
                closed(0);
            } else if (s->flags & SOCK_ESTABLISHED) {
                closed(s->cgroup);
            }
            sockets.delete(&sk);
            bump_epoch();
        }
    }
    return 0;
}
"""

_TRAFFIC_TRACEPOINTS = r"""
static __always_inline void on_length(u16 family, u16 protocol, int ret, u32 dir, u64 sk) {
    if (ret <= 0 || (family != AF_INET && family != AF_INET6))
        return;
    u32 proto;
    if (protocol == IPPROTO_TCP)
        proto = 0;
    else if (protocol == IPPROTO_UDP)
        proto = 1;
    else
        return;
    u64 cgroup = bpf_get_current_cgroup_id();
    add_traffic(cgroup, proto, dir, (u64)ret);
#ifdef GPUSCOPE_SOCKETS
    if (proto == 0)
        remember(sk, cgroup);
#endif
}

TRACEPOINT_PROBE(sock, sock_send_length) {
    on_length(args->family, args->protocol, args->ret, 0, (u64)args->sk);
    return 0;
}

TRACEPOINT_PROBE(sock, sock_recv_length) {
    if (args->flags & MSG_PEEK)
        return 0; /* peeked data is read again later: count it once */
    on_length(args->family, args->protocol, args->ret, 1, (u64)args->sk);
    return 0;
}
"""

_RETRANSMIT = r"""
TRACEPOINT_PROBE(tcp, tcp_retransmit_skb) {
#ifdef RETRANSMIT_HAS_ERR
    if (args->err)
        return 0; /* the retransmission failed to go out: the kernel does not count it either */
#endif
    u64 sk = (u64)args->skaddr;
    struct sock_val *s = sockets.lookup(&sk);
    struct tcp_val *v = tcp_stats(s ? s->cgroup : 0);
    if (v)
        __sync_fetch_and_add(&v->retransmits, 1);
    return 0;
}
"""

_RTT = r"""
BPF_HASH(rtt, struct rtt_key, u64, __MAX_RTT__);

/* tcp_probe fires on every received segment: sample each socket's smoothed RTT at most once
 * per kernel tick (1-10 ms by CONFIG_HZ; jiffies cost nothing to read where ktime costs
 * ~65 ns on a VM), so a 100 Gbit/s flow costs what a chatty one does, and the histogram
 * weighs connections by time rather than by packet rate. */
TRACEPOINT_PROBE(tcp, tcp_probe) {
    u32 srtt = args->srtt; /* microseconds (tp->srtt_us >> 3) */
    if (srtt == 0)
        return 0;
    u64 sk = (u64)args->skaddr;
    u64 now = bpf_jiffies64();
    int slot = 1;
    u64 now_epoch = current_epoch();
    struct sock_memo *m = memo.lookup(&slot);
    if (m && m->sk == sk && m->epoch == now_epoch && now - m->rtt_at < RTT_SAMPLE_JIFFIES)
        return 0;
    struct sock_val *s = sockets.lookup(&sk);
    if (!s || (s->flags & SOCK_PENDING_PASSIVE))
        return 0; /* owner not known yet */
    int sample = now - s->rtt_at >= RTT_SAMPLE_JIFFIES;
    if (sample)
        s->rtt_at = now;
    if (m) {
        m->sk = sk;
        m->cgroup = s->cgroup;
        m->epoch = now_epoch;
        m->rtt_at = s->rtt_at;
    }
    if (!sample)
        return 0;
    u64 cgroup = s->cgroup;
    struct rtt_key k = {};
    k.cgroup = cgroup;
    k.slot = bpf_log2l(srtt);
    if (k.slot >= RTT_SLOTS)
        k.slot = RTT_SLOTS - 1;
    u64 none = 0;
    u64 *n = rtt.lookup_or_try_init(&k, &none);
    if (!n)
        count_full(3);
    else
        __sync_fetch_and_add(n, 1);
    struct tcp_val *v = tcp_stats(cgroup);
    if (v) {
        __sync_fetch_and_add(&v->rtt_sum_us, srtt);
        __sync_fetch_and_add(&v->rtt_count, 1);
    }
    return 0;
}
"""

_CGROUP_SKB = r"""
/* Fallback for kernels without sock:sock_send_length: cgroup_skb programs on the cgroup v2
 * root see every packet of every cgroup. They count IP packet bytes (headers included),
 * not payload. */
static __always_inline void on_skb(struct __sk_buff *skb, u32 dir) {
    struct bpf_sock *sk = skb->sk;
    if (!sk)
        return;
    sk = bpf_sk_fullsock(sk);
    if (!sk)
        return;
    u32 proto;
    if (sk->protocol == IPPROTO_TCP)
        proto = 0;
    else if (sk->protocol == IPPROTO_UDP)
        proto = 1;
    else
        return;
    add_traffic(bpf_skb_cgroup_id(skb), proto, dir, skb->len);
}

int gpuscope_egress(struct __sk_buff *skb) {
    on_skb(skb, 0);
    return 1;
}

int gpuscope_ingress(struct __sk_buff *skb) {
    on_skb(skb, 1);
    return 1;
}
"""


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """Which probes to compile, decided by feature detection on the running kernel."""

    traffic: str  # "tracepoint" | "cgroup_skb"
    connections: bool  # sock:inet_sock_set_state, which also owns the socket -> cgroup map
    retransmits: bool  # tcp:tcp_retransmit_skb (needs connections)
    rtt: bool  # tcp:tcp_probe with an skaddr argument (needs connections)
    retransmit_err: bool = False  # tcp_retransmit_skb has `err` (6.x): skip failed ones

    def modes(self) -> dict[str, str]:
        return {
            "traffic": self.traffic,
            "connections": "tracepoint" if self.connections else "absent",
            "retransmits": "tracepoint" if self.connections and self.retransmits else "absent",
            "rtt": "tracepoint" if self.connections and self.rtt else "absent",
        }


def source() -> str:
    """Every template, before substitution: what the program hash covers."""
    return "\n".join((_COMMON, _SOCKETS, _TRAFFIC_TRACEPOINTS, _RETRANSMIT, _RTT, _CGROUP_SKB))


def program_text(plan: ProbePlan, limits: MapLimits) -> str:
    parts = [_COMMON]
    if plan.connections:  # the socket -> cgroup map that retransmits and RTT attribute by
        parts.append(_SOCKETS)
        if plan.retransmits:
            if plan.retransmit_err:
                parts.append("#define RETRANSMIT_HAS_ERR 1")
            parts.append(_RETRANSMIT)
        if plan.rtt:
            parts.append(_RTT)
    parts.append(_TRAFFIC_TRACEPOINTS if plan.traffic == "tracepoint" else _CGROUP_SKB)
    text = "\n".join(parts)
    for key, value in (
        ("__MAX_TRAFFIC__", limits.traffic),
        ("__MAX_CGROUPS__", limits.cgroups),
        ("__MAX_SOCKETS__", limits.sockets),
        ("__MAX_RTT__", limits.rtt),
        ("__RTT_SLOTS__", RTT_SLOTS),
        ("__RETIRED_FIELDS__", RETIRED_FIELDS),
    ):
        text = text.replace(key, str(value))
    return text
