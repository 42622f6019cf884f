//! The memory budget of one call: every linear memory and table of the call's instance
//! counts against one `limits.memory_bytes`. Growth past it is refused (the guest's
//! allocator sees failure) and remembered, so the trap that usually follows is reported
//! as out of memory.
//!
//! A component may declare several core memories and instances; checking each memory
//! alone would let one call commit the cap once per memory. The pool's per-component
//! limits (set by the engine) refuse, when a component is compiled, any component with
//! more core instances, memories or tables than one pool slot is sized for, so no
//! component can take another's slots; the limiter's counts below repeat that per store.

use wasmtime::ResourceLimiter;

/// Bytes charged per table element (a function reference is a pointer on the host).
pub const TABLE_ELEMENT_BYTES: usize = 8;
/// Table growth beyond this many elements is refused whatever the budget.
const MAX_TABLE_ELEMENTS: usize = 100_000;

pub(crate) struct MemoryLimiter {
    limit: usize,
    used: usize,
    refused: bool,
    instances: usize,
    memories: usize,
    tables: usize,
}

impl MemoryLimiter {
    pub(crate) fn new(
        limit: usize,
        instances: usize,
        memories: usize,
        tables: usize,
    ) -> MemoryLimiter {
        MemoryLimiter {
            limit,
            used: 0,
            refused: false,
            instances,
            memories,
            tables,
        }
    }

    pub(crate) fn refused(&self) -> bool {
        self.refused
    }

    /// Bytes of memories and tables the call holds now (memories never shrink, so at
    /// the call's end this is its peak).
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    fn grow(&mut self, current: usize, desired: usize) -> bool {
        let after = self.used.saturating_sub(current).saturating_add(desired);
        if after > self.limit {
            self.refused = true;
            return false;
        }
        self.used = after;
        true
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(current, desired))
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        // The pool's own bound refused it: still this call running out of memory.
        self.refused = true;
        Ok(())
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            self.refused = true;
            return Ok(false);
        }
        Ok(self.grow(
            current.saturating_mul(TABLE_ELEMENT_BYTES),
            desired.saturating_mul(TABLE_ELEMENT_BYTES),
        ))
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn memories(&self) -> usize {
        self.memories
    }

    fn tables(&self) -> usize {
        self.tables
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_memories_and_tables_share_one_budget() {
        let mut l = MemoryLimiter::new(100 << 20, 8, 4, 4);
        // Two memories of 40 MiB fit; a third does not, nor does growing one past.
        assert!(l.memory_growing(0, 40 << 20, None).unwrap());
        assert!(l.memory_growing(0, 40 << 20, None).unwrap());
        assert!(!l.memory_growing(0, 40 << 20, None).unwrap());
        assert!(l.refused());
        assert!(!l.memory_growing(40 << 20, 61 << 20, None).unwrap());
        assert!(l.memory_growing(40 << 20, 60 << 20, None).unwrap());
        assert_eq!(l.used(), 100 << 20);
        // Tables count too.
        assert!(!l.table_growing(0, 1, None).unwrap());
        let mut l = MemoryLimiter::new(1 << 20, 8, 4, 4);
        assert!(l.table_growing(0, 1000, None).unwrap());
        assert_eq!(l.used(), 1000 * TABLE_ELEMENT_BYTES);
        assert!(!l.table_growing(0, MAX_TABLE_ELEMENTS + 1, None).unwrap());
    }
}
