//! `loop`: spin forever, for the CPU budget and the call deadline to stop.

pub fn run(_: &str) -> String {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}
