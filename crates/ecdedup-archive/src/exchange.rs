//! Sub-file exchange (paper 001, Procedure 2): the k x n_ex sub-files of a
//! batch of n_ex containers are sorted by their unique-block count and
//! regrouped, k at a time, into n_ex groups that are encoded together, so
//! that sub-files with many unique blocks share stripes and those with few
//! share the short ones. Still "pseudo": no sub-file moves; the map records
//! each group's members (the peers needed for decoding).
//!
//! With one container in the batch (no exchange) the group is the
//! container's own k sub-files in order, as in plain RS.

/// A sub-file of the batch: its container's index in the batch, its
/// sub-file number, and its unique-block count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubFileCount {
    pub container_index: usize,
    pub sub_file: u8,
    pub unique: u32,
}

/// Groups of k sub-files; `sub_files.len()` is a multiple of k. The sort is
/// stable and descending, so equal counts keep their batch order.
pub fn exchange(sub_files: &[SubFileCount], k: usize) -> Vec<Vec<SubFileCount>> {
    assert!(k > 0 && sub_files.len().is_multiple_of(k));
    let mut ordered = sub_files.to_vec();
    if sub_files.len() > k {
        ordered.sort_by_key(|b| std::cmp::Reverse(b.unique));
    }
    ordered.chunks(k).map(|c| c.to_vec()).collect()
}

/// Stripes encoded for these groups: the largest unique count in each.
pub fn encoded_stripes(groups: &[Vec<SubFileCount>]) -> u64 {
    groups
        .iter()
        .map(|g| g.iter().map(|s| s.unique).max().unwrap_or(0) as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(per_container: &[&[u32]]) -> Vec<SubFileCount> {
        per_container
            .iter()
            .enumerate()
            .flat_map(|(c, subs)| {
                subs.iter().enumerate().map(move |(j, &u)| SubFileCount {
                    container_index: c,
                    sub_file: j as u8,
                    unique: u,
                })
            })
            .collect()
    }

    #[test]
    fn exchanging_two_files_encodes_fewer_stripes_as_in_figure_3() {
        // Figure 3: before, file 0 needs 4 stripes and file 1 needs 4.
        let subs = counts(&[&[4, 1, 2, 0], &[1, 4, 3, 4]]);
        let alone: u64 = [&subs[..4], &subs[4..]]
            .iter()
            .map(|c| encoded_stripes(&exchange(c, 4)))
            .sum();
        assert_eq!(alone, 8);
        let together = encoded_stripes(&exchange(&subs, 4));
        assert_eq!(together, 4 + 2);
    }

    #[test]
    fn one_container_keeps_its_sub_files_in_order() {
        let subs = counts(&[&[0, 3, 1]]);
        assert_eq!(exchange(&subs, 3), vec![subs.clone()]);
    }
}
