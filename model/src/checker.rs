//! The model as stateright explores it: the initial states, the actions, and their effects.

use std::collections::BTreeSet;

use protocol::fenced::{self, LogEntry};
use protocol::grant::Memory;
use protocol::rows::Event;
use protocol::set as overwrite;
use stateright::{Model, Property};

use crate::*;

impl Model for LockModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        // Every combination of clock offsets within the skew bound; client 0's clock is the
        // reference (shifting every clock alike changes nothing but the horizon).
        let mut offsets: Vec<Vec<u64>> = vec![vec![0]];
        for _ in 1..self.clients {
            offsets = offsets
                .into_iter()
                .flat_map(|o| {
                    (0..=self.skew).map(move |x| {
                        let mut o = o.clone();
                        o.push(x);
                        o
                    })
                })
                .collect();
        }
        offsets
            .into_iter()
            .map(|offsets| World {
                now: START,
                clients: offsets
                    .into_iter()
                    .map(|offset| Client {
                        pc: Pc::Idle,
                        offset,
                        attempts: self.attempts,
                        saw_held: false,
                        resumed: None,
                        update: 0,
                        memory: Memory::default(),
                        started: START,
                        tokens: 0,
                    })
                    .collect(),
                rows: vec![],
                in_flight: vec![],
                dedup: BTreeSet::new(),
                lost_responses: self.lost_responses,
                failures: self.failures,
                window_expiries: self.window_expiries,
                forces: self.forces,
                merges: self.merges,
                setters: vec![Setter::Idle; usize::from(self.sets)],
                set_landed: 0,
                written: vec![],
                forced: 0,
                acknowledged: 0,
                replaced: 0,
                crashes: self.crashes,
                killed_at: None,
                locked_out: false,
                recovered: false,
                gave_back: false,
                heeded: false,
            })
            .collect()
    }

    fn actions(&self, world: &World, actions: &mut Vec<Action>) {
        if world.now < START + self.horizon {
            actions.push(Action::Tick);
        }
        for (i, c) in world.clients.iter().enumerate() {
            let steps = matches!(
                c.pc,
                Pc::Idle
                    | Pc::Asks { .. }
                    | Pc::Paused { .. }
                    | Pc::Settling { .. }
                    | Pc::InSection
            );
            if !steps {
                continue;
            }
            let reads = matches!(c.pc, Pc::Asks { .. } | Pc::Settling { .. } | Pc::Idle);
            let replicas = if reads { self.replicas_to_ask() } else { 1 };
            for replica in 0..replicas {
                actions.push(Action::Step {
                    client: i as u8,
                    replica,
                });
            }
        }
        for (index, f) in world.in_flight.iter().enumerate() {
            if f.landed {
                if f.client.is_some() {
                    actions.push(Action::Ack { index });
                    if world.lost_responses > 0 {
                        actions.push(Action::Lose { index });
                    }
                }
            } else {
                for replica in 0..self.replicas_to_ask() {
                    actions.push(Action::Land { index, replica });
                }
            }
            if f.client.is_some() && world.failures > 0 {
                actions.push(Action::Fail { index });
            }
        }
        if !self.quorum() {
            for (row, r) in world.rows.iter().enumerate() {
                for replica in 0..self.replicas {
                    if r.replicas & (1 << replica) == 0 {
                        actions.push(Action::Replicate { row, replica });
                    }
                }
            }
        }
        if world.window_expiries > 0 && !world.dedup.is_empty() {
            actions.push(Action::WindowPasses);
        }
        if world.merges > 0 {
            for replica in 0..self.replicas_to_ask() {
                actions.push(Action::Merge { replica });
            }
        }
        if world.forces > 0
            && !fenced::fold(log(world.rows.iter().map(|r| &r.row))).is_free(world.now)
        {
            actions.push(Action::Force);
        }
        if world.crashes > 0 {
            for (i, c) in world.clients.iter().enumerate() {
                if matches!(c.pc, Pc::Idle) && c.memory.kept.is_some() {
                    actions.push(Action::Kill { client: i as u8 });
                }
            }
        }
        for (s, setter) in world.setters.iter().enumerate() {
            if matches!(setter, Setter::Idle | Setter::Asks { .. }) {
                for replica in 0..self.replicas_to_ask() {
                    actions.push(Action::SetStep {
                        setter: s as u8,
                        replica,
                    });
                }
            }
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut world = last.clone();
        match action {
            Action::Tick => {
                world.now += 1;
                for c in &mut world.clients {
                    if let Pc::Paused { woken, .. } = &mut c.pc {
                        *woken = true;
                    }
                }
            }
            Action::Step { client, replica } => {
                if !self.step(&mut world, client, replica) {
                    return None;
                }
            }
            Action::Land { index, replica } => {
                let replicas = if self.quorum() {
                    self.all_replicas()
                } else {
                    1 << replica
                };
                let f = &world.in_flight[index];
                // Sent again after a lost response: the server evaluates the guard anew.
                let refused = f
                    .guard
                    .as_ref()
                    .is_some_and(|g| f.dropped && !Self::admits(g, world.view(replica)))
                    || f.unless_newer && {
                        let stored = final_state(world.view(replica)).map(|s| s.version);
                        let Row::State { version, .. } = f.row else {
                            unreachable!("a set writes state")
                        };
                        !overwrite::lands(stored, version)
                    };
                let f = &mut world.in_flight[index];
                f.landed = true;
                f.dropped = refused;
                let (row, token) = (f.row.clone(), f.token.clone());
                // Keeper's deduplication: the token is checked and stored with the part, in
                // one transaction, cluster-wide.
                if refused || !world.dedup.insert(token) {
                    world.in_flight[index].dropped = true;
                } else {
                    if let Row::State {
                        client,
                        version: set_version,
                        ..
                    } = row
                        && let Some(setter) = self.setter_of(client)
                        && world.set_landed & (1 << setter) == 0
                    {
                        // The set takes effect: it replaces what landed before it and what was
                        // on its way (in either order the set may win: the two ran at once), at
                        // or below its version. Landing again later is not another set.
                        world.set_landed |= 1 << setter;
                        let in_flight = world.in_flight.iter().map(|f| &f.row);
                        for r in world.written.iter().chain(in_flight) {
                            if let Row::State {
                                updates, version, ..
                            } = *r
                                && version <= set_version
                            {
                                world.replaced |= updates & !SET_BITS;
                            }
                        }
                    }
                    if let Row::State { .. } = row {
                        world.written.push(row.clone());
                    }
                    world.rows.push(Landed { row, replicas });
                }
                // Given up on by its client: nobody waits for the answer.
                if world.in_flight[index].client.is_none() {
                    world.in_flight.remove(index);
                }
            }
            Action::Ack { index } => {
                let f = world.in_flight.remove(index);
                match f.client.map(|c| (c, self.setter_of(c))) {
                    Some((_, Some(setter))) => self.set_acknowledged(&mut world, setter, &f),
                    Some((client, None)) => self.acknowledge(&mut world, client, &f.row, f.dropped),
                    None => {}
                }
            }
            Action::Lose { index } => {
                world.lost_responses -= 1;
                let f = world.in_flight[index].clone();
                let client = f.client?;
                let past = f
                    .retry_until
                    .is_some_and(|u| self.clock(&world, client) > u);
                if past {
                    world.in_flight.remove(index);
                    self.failed(&mut world, client);
                } else {
                    // Sent again; `dropped` marks it as a resend for the guard.
                    let f = &mut world.in_flight[index];
                    f.landed = false;
                    f.dropped = true;
                    f.resent = true;
                }
            }
            Action::Fail { index } => {
                world.failures -= 1;
                let client = world.in_flight[index].client?;
                if world.in_flight[index].landed {
                    world.in_flight.remove(index);
                } else {
                    world.in_flight[index].client = None;
                }
                self.failed(&mut world, client);
            }
            Action::Replicate { row, replica } => world.rows[row].replicas |= 1 << replica,
            Action::WindowPasses => {
                world.window_expiries -= 1;
                world.dedup.clear();
            }
            Action::Merge { replica } => {
                world.merges -= 1;
                if !self.merge(&mut world, replica) {
                    return None;
                }
            }
            Action::SetStep { setter, replica } => {
                if !self.set_step(&mut world, setter, replica) {
                    return None;
                }
            }
            Action::Kill { client } => {
                world.crashes -= 1;
                world.killed_at = Some(world.now);
                world.clients[client as usize].pc = Pc::Killed;
                // The server may still finish what it sent; nobody waits for the answers.
                world.in_flight.retain_mut(|f| {
                    if f.client == Some(client) {
                        f.client = None;
                        return !f.landed;
                    }
                    true
                });
            }
            Action::Force => {
                // The operator's row lands at once (its own insert races nothing here).
                world.forces -= 1;
                let current = fenced::fold(log(world.rows.iter().map(|r| &r.row)));
                world.forced |= 1 << current.generation;
                world.rows.push(Landed {
                    row: Row::Log(Entry(LogEntry {
                        state_id: "s".into(),
                        generation: current.generation,
                        event: Event::Force,
                        owner: "operator".into(),
                        at_ms: world.now,
                        until_ms: 0,
                        floor_ms: 0,
                    })),
                    replicas: self.all_replicas(),
                });
            }
        }
        Some(world)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        self.property_list()
    }

    fn within_boundary(&self, world: &World) -> bool {
        world.now <= START + self.horizon
    }
}
