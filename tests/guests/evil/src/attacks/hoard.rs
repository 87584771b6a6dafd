//! `alloc`: allocate without bound, for the memory limit to stop.

pub fn run(_: &str) -> String {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(vec![1u8; 1 << 20]);
        std::hint::black_box(&hoard);
    }
}
