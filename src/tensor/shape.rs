//! Shape validation: every dimension a non-negative integer, the element count and byte size
//! representable.

use super::TensorError;

/// Checks a shape given as signed integers and returns it as sizes.
pub fn validate(dims: &[i64]) -> Result<Vec<usize>, TensorError> {
    dims.iter()
        .enumerate()
        .map(|(index, &dim)| {
            usize::try_from(dim).map_err(|_| {
                TensorError::BadShape(format!(
                    "dimension {index} is {dim}; sizes must be non-negative"
                ))
            })
        })
        .collect()
}

/// Number of elements of `shape`, or an error when the product overflows.
pub fn numel(shape: &[usize]) -> Result<usize, TensorError> {
    shape.iter().try_fold(1_usize, |acc, &dim| {
        acc.checked_mul(dim).ok_or_else(|| {
            TensorError::BadShape(format!(
                "the number of elements of {shape:?} overflows 64 bits"
            ))
        })
    })
}

/// Bytes needed for `numel` elements of `element_size` bytes.
pub fn nbytes(shape: &[usize], element_size: usize) -> Result<u64, TensorError> {
    numel(shape)?
        .checked_mul(element_size)
        .map(|bytes| bytes as u64)
        .ok_or_else(|| {
            TensorError::BadShape(format!("the byte size of {shape:?} overflows 64 bits"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_negative_and_overflowing_shapes() {
        assert_eq!(validate(&[2, 3]).ok(), Some(vec![2, 3]));
        assert!(validate(&[2, -3]).is_err());
        assert!(numel(&[usize::MAX, 2]).is_err());
        assert_eq!(numel(&[]).ok(), Some(1));
        assert_eq!(numel(&[4, 0]).ok(), Some(0));
        assert!(nbytes(&[usize::MAX / 2], 4).is_err());
    }
}
