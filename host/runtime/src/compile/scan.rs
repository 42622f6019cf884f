//! The pre-scan: what a component's binary asks the compiler to do, read with wasmparser
//! before anything is compiled. It reads every byte once and keeps nothing but counts, so
//! it costs time linear in the binary and no memory to speak of, whatever the binary
//! holds; Cranelift's cost grows with the same counts (a 1.8 MB component of 100,000 tiny
//! functions took 14 s of CPU and 607 MiB to compile).

use wasmparser::{Operator, Parser, Payload};

/// What the compiler would be asked to compile: the core functions of every module the
/// component holds, nested components included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Shape {
    /// Function bodies, across all core modules.
    pub functions: u64,
    /// Bytes of all function bodies.
    pub code_bytes: u64,
    /// The most locals one function declares.
    pub max_locals: u64,
    /// The deepest nesting of blocks, loops, ifs and trys in one function.
    pub max_nesting: u64,
}

/// The binary could not be read as WebAssembly (the compiler would refuse it too).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScanError(String);

impl From<wasmparser::BinaryReaderError> for ScanError {
    fn from(e: wasmparser::BinaryReaderError) -> ScanError {
        ScanError(e.to_string())
    }
}

/// Reads the component's shape.
pub fn shape(bytes: &[u8]) -> Result<Shape, ScanError> {
    let mut shape = Shape::default();
    // `parse_all` descends into nested modules and components: their code is compiled too.
    for payload in Parser::new(0).parse_all(bytes) {
        if let Payload::CodeSectionEntry(body) = payload? {
            shape.functions += 1;
            shape.code_bytes += body.range().len() as u64;
            shape.max_locals = shape.max_locals.max(locals(&body)?);
            shape.max_nesting = shape.max_nesting.max(nesting(&body)?);
        }
    }
    Ok(shape)
}

/// Locals one function declares (summed over its declarations).
fn locals(body: &wasmparser::FunctionBody<'_>) -> Result<u64, ScanError> {
    let mut total = 0u64;
    for local in body.get_locals_reader()? {
        total += u64::from(local?.0);
    }
    Ok(total)
}

/// The deepest nesting of control frames in one function's code.
fn nesting(body: &wasmparser::FunctionBody<'_>) -> Result<u64, ScanError> {
    let mut ops = body.get_operators_reader()?;
    let (mut depth, mut max) = (0u64, 0u64);
    while !ops.eof() {
        match ops.read()? {
            Operator::Block { .. }
            | Operator::Loop { .. }
            | Operator::If { .. }
            | Operator::Try { .. }
            | Operator::TryTable { .. } => {
                depth += 1;
                max = max.max(depth);
            }
            // `delegate` ends a `try` like `end` does.
            Operator::End | Operator::Delegate { .. } => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component(core: &str) -> Vec<u8> {
        wat::parse_str(format!("(component (core module {core}))")).unwrap()
    }

    #[test]
    fn functions_code_locals_and_nesting_are_counted_in_nested_modules() {
        let wasm = component(
            r#"(func (local i32 i64) (local f32))
               (func (block (loop (if (i32.const 0) (then (block))))))
               (func (param i32) (local $a i32) nop)"#,
        );
        let s = shape(&wasm).unwrap();
        assert_eq!(s.functions, 3);
        assert_eq!(s.max_locals, 3, "params are not locals");
        assert_eq!(s.max_nesting, 4);
        assert!(s.code_bytes > 10 && s.code_bytes < 100, "{s:?}");

        let nested = wat::parse_str(
            r#"(component
                 (core module (func) (func))
                 (component (core module (func (block (block))) (func) (func))))"#,
        )
        .unwrap();
        let s = shape(&nested).unwrap();
        assert_eq!(
            s.functions, 5,
            "the nested component's module is compiled too"
        );
        assert_eq!(s.max_nesting, 2);
    }

    #[test]
    fn a_wide_component_is_seen_as_wide() {
        let funcs = "(func)".repeat(10_000);
        let s = shape(&component(&funcs)).unwrap();
        assert_eq!(s.functions, 10_000);
        assert_eq!(s.max_nesting, 0);
    }

    #[test]
    fn a_cut_binary_is_an_error_not_a_shape() {
        let wasm = component("(func (block (block)))");
        assert!(shape(&wasm[..wasm.len() - 3]).is_err());
        assert!(shape(b"\0asm\x0d\0\x01\0garbage").is_err());
    }
}
