//! Element types, named as in PyTorch.

use std::fmt;
use std::str::FromStr;

use super::TensorError;

/// A tensor's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float, the default.
    Float32,
    /// IEEE half precision.
    Float16,
    /// bfloat16.
    BFloat16,
    /// 64-bit float.
    Float64,
    /// 64-bit signed integer.
    Int64,
    /// 32-bit signed integer.
    Int32,
    /// Unsigned byte.
    UInt8,
    /// Boolean, one byte each.
    Bool,
}

impl DType {
    /// Every dtype, in the order documentation lists them.
    pub const ALL: [DType; 8] = [
        DType::Float32,
        DType::Float16,
        DType::BFloat16,
        DType::Float64,
        DType::Int64,
        DType::Int32,
        DType::UInt8,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Float64 | DType::Int64 => 8,
            DType::Float32 | DType::Int32 => 4,
            DType::Float16 | DType::BFloat16 => 2,
            DType::UInt8 | DType::Bool => 1,
        }
    }

    /// The canonical name (`"float32"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Float32 => "float32",
            DType::Float16 => "float16",
            DType::BFloat16 => "bfloat16",
            DType::Float64 => "float64",
            DType::Int64 => "int64",
            DType::Int32 => "int32",
            DType::UInt8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// Whether the type holds floating-point values.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::Float32 | DType::Float16 | DType::BFloat16 | DType::Float64
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = TensorError;

    /// Accepts the canonical names, PyTorch's aliases (`float`, `half`, `double`, `long`,
    /// `int`) and a `torch.` prefix.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let name = text.trim().strip_prefix("torch.").unwrap_or(text.trim());
        Ok(match name {
            "float32" | "float" => DType::Float32,
            "float16" | "half" => DType::Float16,
            "bfloat16" => DType::BFloat16,
            "float64" | "double" => DType::Float64,
            "int64" | "long" => DType::Int64,
            "int32" | "int" => DType::Int32,
            "uint8" => DType::UInt8,
            "bool" => DType::Bool,
            _ => return Err(TensorError::UnknownDType(text.to_string())),
        })
    }
}
