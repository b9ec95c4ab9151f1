-- The benchmark's query (benchmarks/kafka_catch_up.py runs the same one in Flink SQL): the
-- history joined with the accounts, aggregated by the account's branch.
{{ config(unique_key='bid') }}
select a.bid, count(*) as n, sum(h.delta) as delta_sum
from {{ source('pgbench', 'pgbench_history') }} h
join {{ source('pgbench', 'pgbench_accounts') }} a on h.aid = a.aid
group by a.bid
