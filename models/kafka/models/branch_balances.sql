-- Per branch: its balance, the sum of its history's deltas, and the three global sums of
-- TPC-B (every transaction adds the same delta to one account, one teller and one branch).
-- At every committed version bbalance = hist and asum = tsum = bsum.
{{ config(unique_key='bid') }}
select b.bid, b.bbalance, coalesce(h.total, 0) as hist,
       (select sum(abalance) from {{ source('pgbench', 'pgbench_accounts') }}) as asum,
       (select sum(tbalance) from {{ source('pgbench', 'pgbench_tellers') }}) as tsum,
       (select sum(bbalance) from {{ source('pgbench', 'pgbench_branches') }}) as bsum
from {{ source('pgbench', 'pgbench_branches') }} b
left join (select bid, sum(delta) as total from {{ source('pgbench', 'pgbench_history') }} group by bid) h
  on h.bid = b.bid
