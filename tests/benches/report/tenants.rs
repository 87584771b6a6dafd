//! Section 6 of the report, noisy neighbours: 100 tenants in one process, each with an
//! instance of its own. Most do ordinary work (an `update`, then a `get`, of their own state,
//! with a pause between calls); in the noisy phases one tenant's guest spins (the evil guest,
//! stopped by its CPU budget and started again, for as long as the phase lasts) and another's
//! ClickHouse answers late (the fault hook holds every answer back). Quiet and noisy phases
//! alternate, so that all see the same machine; the others' latencies are compared between
//! them. A third kind of phase lifts the spinner's CPU share, to show what the share is for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::state_host::http::faults::{Fault, FaultPlan};
use integration_tests::state_host::{
    Backend, CpuShare, Error, InstanceOptions, Runtime, RuntimeOptions, State,
    default_component_path,
};
use integration_tests::{TestTable, runtime, runtime_options, splitmix64};

use crate::bookmark;
use crate::stats::Samples;

/// The spinning tenant's CPU budget per call: it is stopped after this much, and opened again.
pub const SPIN_BUDGET: Duration = Duration::from_millis(500);
/// A phase in which at least [`STALL_CALLS`] calls took longer than this saw the engine stall:
/// the local ClickHouse now and then holds every tenant's inserts for 0.3–2 s at once, in
/// quiet phases as in noisy ones. One such stall decides a p99 pooled over all phases.
pub const STALL_MS: f64 = 300.0;
pub const STALL_CALLS: usize = 5;
/// How late the slow tenant's ClickHouse answers.
pub const LATE_BY: Duration = Duration::from_millis(1500);

pub struct Plan {
    pub tenants: usize,
    /// Rounds of three phases: quiet, noisy, noisy with the spinner's CPU share lifted.
    pub rounds: usize,
    pub phase: Duration,
    /// The mean pause between a tenant's calls (drawn uniformly from 0 to twice this).
    pub think: Duration,
}

/// What the ordinary tenants saw in one kind of phase, and what the noisy two did meanwhile.
#[derive(Default)]
pub struct Seen {
    /// Latencies of the ordinary tenants' calls.
    pub calls: Samples,
    /// The p99 of each phase of this kind.
    pub phase_p99: Samples,
    /// Phases of this kind in which the engine stalled (see [`STALL_MS`]).
    pub stalled_phases: usize,
    /// How often the spinning tenant was stopped by its CPU budget.
    pub spinner_stops: usize,
    /// Latencies of the slow tenant's calls.
    pub slow: Samples,
}

pub struct Outcome {
    pub quiet: Seen,
    /// Beside a spinner held to the default CPU share of a tenant.
    pub noisy: Seen,
    /// Beside a spinner that may take all the CPU it gets.
    pub unshared: Seen,
}

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Quiet,
    Noisy,
    Unshared,
}

/// Every answer comes late.
struct Late;

impl FaultPlan for Late {
    fn fault(&self, _: &http::Method, _: &http::Uri) -> Option<Fault> {
        Some(Fault::Late(LATE_BY))
    }
}

/// The endpoint of the spinning tenant: its guest never calls out, so nothing listens there.
const SPINNER_URI: &str = "clickhouse://default:@127.0.0.1:9/default";

fn evil_runtime(cpu_share: Option<CpuShare>) -> Arc<Runtime> {
    let options = RuntimeOptions {
        cpu_budget: SPIN_BUDGET,
        cpu_share,
        ..runtime_options()
    };
    Arc::new(
        Runtime::load(
            &default_component_path().with_file_name("evil_guest.wasm"),
            options,
        )
        .unwrap_or_else(|e| panic!("{e}; build it with `just guest`")),
    )
}

pub fn run(tokio: &tokio::runtime::Runtime, plan: &Plan) -> Outcome {
    let table = Arc::new(TestTable::new("bench_tenants"));
    let shared = evil_runtime(runtime_options().cpu_share);
    let unshared = evil_runtime(None);
    let ordinary = plan.tenants - 2;
    let mut tenants: Vec<Option<Backend>> = tokio.block_on(async {
        let mut tenants = Vec::with_capacity(ordinary);
        for _ in 0..ordinary {
            let backend = runtime()
                .open(
                    &table.target.uri(),
                    table.with(&[("lock_linger_seconds", "5")]),
                )
                .await
                .expect("opens a tenant");
            tenants.push(Some(backend));
        }
        tenants
    });
    // The slow tenant's first update (four late round trips) is done before the phases.
    let mut slow = Some(tokio.block_on(async {
        let mut backend = open_slow(&table).await;
        call(&mut backend, SLOW_ID, 0).await;
        backend
    }));
    let mut seen: [Seen; 3] = Default::default();
    // A first quiet phase warms every tenant (its first update claims the lock it keeps).
    let phases = std::iter::once(None).chain(
        (0..plan.rounds)
            .flat_map(|_| [Phase::Quiet, Phase::Noisy, Phase::Unshared])
            .map(Some),
    );
    for (p, phase) in phases.enumerate() {
        let until = Instant::now() + plan.phase;
        let spinner = match phase {
            Some(Phase::Noisy) => Some(&shared),
            Some(Phase::Unshared) => Some(&unshared),
            _ => None,
        };
        let (latencies, stops, slow_calls) = tokio.block_on(async {
            let workers: Vec<_> = tenants
                .iter_mut()
                .enumerate()
                .map(|(n, slot)| {
                    let backend = slot.take().expect("a tenant's instance");
                    let seed = (p * 1000 + n) as u64;
                    tokio::spawn(work(backend, n, until, plan.think, seed))
                })
                .collect();
            let noise = spinner.map(|evil| {
                let backend = slow.take().expect("the slow tenant's instance");
                (
                    tokio::spawn(spin(Arc::clone(evil), until)),
                    tokio::spawn(lag(backend, until, plan.think)),
                )
            });
            let mut latencies = Vec::new();
            for (n, worker) in workers.into_iter().enumerate() {
                let (backend, samples) = worker.await.expect("a tenant's task");
                tenants[n] = Some(backend);
                latencies.push(samples);
            }
            match noise {
                Some((spinner, lagging)) => {
                    let stops = spinner.await.expect("the spinner's task");
                    let (backend, samples) = lagging.await.expect("the slow tenant's task");
                    slow = Some(backend);
                    (latencies, stops, samples)
                }
                None => (latencies, 0, Samples::default()),
            }
        });
        let Some(phase) = phase else { continue };
        let k = phase as usize;
        let this_phase: Samples = latencies.iter().flat_map(Samples::iter).collect();
        seen[k].phase_p99.push(this_phase.p99());
        if this_phase.iter().filter(|&ms| ms > STALL_MS).count() >= STALL_CALLS {
            seen[k].stalled_phases += 1;
        }
        for ms in this_phase.iter() {
            seen[k].calls.push(ms);
        }
        seen[k].spinner_stops += stops;
        for ms in slow_calls.iter() {
            seen[k].slow.push(ms);
        }
    }
    tokio.block_on(async {
        for backend in tenants.into_iter().flatten().chain(slow) {
            backend.close().await.expect("closes a tenant");
        }
    });
    let [quiet, noisy, unshared] = seen;
    Outcome {
        quiet,
        noisy,
        unshared,
    }
}

/// A tenant's ordinary work until `until`: pause, then `update` or `get` its own state.
async fn work(
    mut backend: Backend,
    n: usize,
    until: Instant,
    think: Duration,
    seed: u64,
) -> (Backend, Samples) {
    let id = format!("tenant:{n:03}");
    let mut draw = Jitter(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n as u64);
    let mut samples = Samples::default();
    for i in 0.. {
        let pause = think.mul_f64(2.0 * draw.unit());
        if Instant::now() + pause >= until {
            break;
        }
        tokio::time::sleep(pause).await;
        let started = Instant::now();
        call(&mut backend, &id, i).await;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    (backend, samples)
}

async fn call(backend: &mut Backend, id: &str, i: usize) {
    if i.is_multiple_of(2) {
        backend
            .update(&State::partial(id, bookmark(i)))
            .await
            .expect("a tenant's update");
    } else {
        backend.get(id).await.expect("a tenant's get");
    }
}

const SLOW_ID: &str = "tenant:slow";

async fn open_slow(table: &TestTable) -> Backend {
    let options = InstanceOptions {
        label: "slow".into(),
        faults: Some(Arc::new(Late)),
        ..InstanceOptions::default()
    };
    runtime()
        .open_with(
            &table.target.uri(),
            table.with(&[("lock_linger_seconds", "5")]),
            options,
        )
        .await
        .expect("opens the slow tenant")
}

/// The slow tenant until `until`: the same work, every answer of its ClickHouse late. Its call
/// in flight at the end is let finish (the next phase starts after it).
async fn lag(mut backend: Backend, until: Instant, think: Duration) -> (Backend, Samples) {
    let mut samples = Samples::default();
    for i in 1.. {
        if Instant::now() >= until {
            break;
        }
        let started = Instant::now();
        call(&mut backend, SLOW_ID, i).await;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(think.min(until.saturating_duration_since(Instant::now()))).await;
    }
    (backend, samples)
}

/// The spinning tenant until `until`: each call spins until its CPU budget stops it, and the
/// tenant is opened again (as a runner would restart it); the call still spinning at the end
/// is dropped with its instance. Returns how often it was stopped.
async fn spin(evil: Arc<Runtime>, until: Instant) -> usize {
    let end = tokio::time::Instant::from_std(until);
    let mut stops = 0;
    loop {
        let mut backend = evil
            .open(SPINNER_URI, vec![])
            .await
            .expect("opens the spinner");
        tokio::select! {
            outcome = backend.get("loop") => match outcome {
                Err(Error::Timeout(m)) if m.contains("CPU budget") => stops += 1,
                other => panic!("the spinner was not stopped by its CPU budget: {other:?}"),
            },
            () = tokio::time::sleep_until(end) => return stops,
        }
    }
}

/// Uniform draws in [0, 1), from a seed (splitmix64): tenants pause differently, and a run
/// can be repeated.
struct Jitter(u64);

impl Jitter {
    fn unit(&mut self) -> f64 {
        (splitmix64(&mut self.0) >> 11) as f64 / (1u64 << 53) as f64
    }
}
