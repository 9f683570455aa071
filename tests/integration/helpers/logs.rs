//! A log written to memory, for a test to read back what the shop logged.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// Cloned into a subscriber's writer; every clone writes to the same buffer.
/// A process has one global subscriber: tests that install one run
/// `alone_in_process`.
#[derive(Clone, Default)]
pub struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLog {
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).expect("the log is UTF-8")
    }
}
