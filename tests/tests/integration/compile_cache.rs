//! The per-user cache of the compiled component: the first load compiles and stores, later
//! loads read native code; concurrent first loads, an unwritable cache and a corrupt entry all
//! still load the component.

use std::path::Path;

use integration_tests::state_host::cache::{self, Outcome};
use integration_tests::state_host::{Runtime, RuntimeOptions, default_component_path};

fn wasm() -> Vec<u8> {
    let path = default_component_path();
    assert_eq!(
        path.extension().and_then(|e| e.to_str()),
        Some("wasm"),
        "{path:?}"
    );
    std::fs::read(&path).expect("the component (just guest)")
}

fn load(wasm: &[u8], dir: Option<&Path>) -> Runtime {
    let options = RuntimeOptions {
        compile_cache: dir.map(Path::to_path_buf),
        ..RuntimeOptions::default()
    };
    Runtime::from_bytes(wasm, options).expect("loads")
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn the_first_load_compiles_and_stores_and_the_next_reads_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("nested").join("cache");
    let wasm = wasm();
    let first = load(&wasm, Some(&cache));
    let Outcome::Stored(path) = first.loaded().clone() else {
        panic!("expected a stored entry, got {:?}", first.loaded());
    };
    assert!(path.starts_with(&cache) && path.exists());
    let second = load(&wasm, Some(&cache));
    assert_eq!(second.loaded(), &Outcome::Hit(path.clone()));
    // one entry, named for the component and the engine, and no temporary file left
    let names = entries(&cache);
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].ends_with(".cwasm"), "{names:?}");
    // another component, or another engine configuration, gets another entry
    let engine = second.engine();
    assert_ne!(cache::entry(&cache, engine, b"another component"), path);
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    let other_engine = wasmtime::Engine::new(&config).unwrap();
    assert_ne!(cache::entry(&cache, &other_engine, &wasm), path);
}

#[test]
fn concurrent_first_loads_each_succeed_and_leave_one_whole_entry() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = std::sync::Arc::new(wasm());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (wasm, dir) = (wasm.clone(), dir.path().to_path_buf());
            std::thread::spawn(move || load(&wasm, Some(&dir)).loaded().clone())
        })
        .collect();
    for thread in threads {
        let outcome = thread.join().expect("no panic");
        assert!(
            matches!(outcome, Outcome::Stored(_) | Outcome::Hit(_)),
            "{outcome:?}"
        );
    }
    let names = entries(dir.path());
    assert_eq!(names.len(), 1, "one entry, no temporary files: {names:?}");
    assert!(matches!(
        load(&wasm, Some(dir.path())).loaded(),
        Outcome::Hit(_)
    ));
}

#[test]
fn an_unwritable_cache_compiles_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    // A directory cannot be made below a file.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let runtime = load(&wasm(), Some(&file.join("cache")));
    match runtime.loaded() {
        Outcome::Uncached(why) => assert!(why.contains("cannot write"), "{why}"),
        other => panic!("expected an in-memory compile, got {other:?}"),
    }
    let runtime = load(&wasm(), None);
    assert!(matches!(runtime.loaded(), Outcome::Uncached(_)));
}

#[test]
fn a_corrupt_or_stale_entry_is_compiled_again_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = wasm();
    let Outcome::Stored(path) = load(&wasm, Some(dir.path())).loaded().clone() else {
        panic!("stored");
    };
    // A truncated entry, as a full disk might leave by another tool's hand.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let runtime = load(&wasm, Some(dir.path()));
    assert_eq!(runtime.loaded(), &Outcome::Stored(path.clone()));
    assert_eq!(std::fs::read(&path).unwrap().len(), bytes.len());
    assert_eq!(load(&wasm, Some(dir.path())).loaded(), &Outcome::Hit(path));
}
