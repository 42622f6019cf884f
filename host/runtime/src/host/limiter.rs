//! The per-call memory cap. Growth past the limit is refused (the guest's allocator sees
//! failure) and remembered, so the trap that usually follows is reported as out of memory.

use wasmtime::ResourceLimiter;

/// Table growth beyond this is refused too (tables hold function references).
const MAX_TABLE_ELEMENTS: usize = 100_000;

pub(crate) struct MemoryLimiter {
    limit: usize,
    refused: bool,
}

impl MemoryLimiter {
    pub(crate) fn new(limit: usize) -> MemoryLimiter {
        MemoryLimiter {
            limit,
            refused: false,
        }
    }

    pub(crate) fn refused(&self) -> bool {
        self.refused
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.refused = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        // The pool's own bound refused it: still this call running out of memory.
        self.refused = true;
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}
