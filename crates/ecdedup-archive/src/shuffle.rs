//! Pseudo-shuffling (paper 001, Procedure 1): within one sub-file, unique
//! blocks take the leftmost virtual positions in their order and redundant
//! blocks the rightmost, from the last position leftwards. Nothing moves on
//! a device; the positions go into the map-address table.
//!
//! Invariant: the positions of a sub-file are a permutation of
//! `0..blocks`, and the unique blocks hold exactly `0..unique_count`.

/// Virtual positions of a sub-file's blocks, given which are unique, and
/// the number of unique blocks.
pub fn pseudo_shuffle(unique: &[bool]) -> (Vec<u32>, u32) {
    let mut next_unique = 0u32;
    let mut next_redundant = unique.len() as u32;
    let positions = unique
        .iter()
        .map(|&is_unique| {
            if is_unique {
                next_unique += 1;
                next_unique - 1
            } else {
                next_redundant -= 1;
                next_redundant
            }
        })
        .collect();
    (positions, next_unique)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_blocks_go_left_and_redundant_blocks_right_from_the_end() {
        // The paper's Figure 2, row 0: blocks 0 and 3 unique.
        let (positions, unique) = pseudo_shuffle(&[true, false, false, true]);
        assert_eq!(positions, vec![0, 3, 2, 1]);
        assert_eq!(unique, 2);
    }

    #[test]
    fn positions_are_a_permutation() {
        let pattern: Vec<bool> = (0..97).map(|i| i % 3 == 0 || i % 7 == 1).collect();
        let (mut positions, unique) = pseudo_shuffle(&pattern);
        assert_eq!(unique as usize, pattern.iter().filter(|u| **u).count());
        positions.sort();
        assert_eq!(positions, (0..97).collect::<Vec<u32>>());
    }
}
