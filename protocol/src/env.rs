//! What the protocol asks of its surroundings besides the statements it sends: time, unique
//! tokens, randomness and a log. The guest answers from the host; the model from its world.

/// How much a log line matters (the host maps it to its own levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// What the protocol asks of its surroundings besides the statements: time, tokens, a log.
pub trait Env {
    fn now_ms(&self) -> u64;
    /// A fresh unique id (owners of claims, deduplication tokens of state writes).
    fn new_token(&mut self) -> String;
    /// The owner of a new lock claim: unique, as a token is (the guest prefixes its instance's
    /// id, so that the claimant can be found).
    fn new_owner(&mut self) -> String {
        self.new_token()
    }
    fn random(&mut self) -> u64;
    fn log(&mut self, level: Level, message: &str);
}
