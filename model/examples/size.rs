//! Explores one configuration of the model and prints its size and what it found, for tuning
//! bounds: `K=lease H=horizon S=skew L=lost X=failures W=window U=updates F=forces C=clients
//! G=merges T=sets O=timeout Z=kills Y=explicit lock's lease (the update's from the rule)
//! R=replicas P=settle(1) cargo run --release -p lock-model --example size`.
use lock_model::LockModel;
use stateright::{Checker, HasDiscoveries, Model};

fn main() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let mut m = if env("P", 0) == 1 {
        LockModel::settle()
    } else {
        LockModel::fenced()
    };
    m.lease = env("K", m.lease);
    m.horizon = env("H", m.horizon);
    m.skew = env("S", m.skew);
    m.lost_responses = env("L", m.lost_responses.into()) as u8;
    m.failures = env("X", m.failures.into()) as u8;
    m.window_expiries = env("W", m.window_expiries.into()) as u8;
    m.updates = env("U", m.updates.into()) as u8;
    m.forces = env("F", m.forces.into()) as u8;
    m.clients = env("C", m.clients.into()) as u8;
    m.merges = env("G", m.merges.into()) as u8;
    m.sets = env("T", m.sets.into()) as u8;
    m.timeout = env("O", m.timeout);
    m.crashes = env("Z", m.crashes.into()) as u8;
    m.replicas = env("R", m.replicas.into()) as u8;
    if let Some(lease) = std::env::var("Y").ok().and_then(|v| v.parse().ok()) {
        m.lock_lease = Some(lease);
    }
    let started = std::time::Instant::now();
    let checker = m
        .clone()
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    println!(
        "{m:?}\n{} states ({} unique), depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    for (name, path) in checker.discoveries() {
        println!(
            "{name}: {} steps\n{path:?}",
            path.clone().into_actions().len()
        );
    }
}
