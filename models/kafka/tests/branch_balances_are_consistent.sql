-- TPC-B's invariants, which hold in every transaction-consistent state: a row returned is a
-- version that mixed the effects of different transactions.
select * from {{ ref('branch_balances') }}
where bbalance <> hist or asum <> tsum or tsum <> bsum
