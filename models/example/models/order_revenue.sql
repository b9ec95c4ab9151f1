-- Level 2 of the example chain: revenue per order, over the staging view and orders.
-- Downstream models read it through ref() as a changelog (its target's Change Data Feed).
{{ config(unique_key='o_orderkey') }}

select
    o.o_orderkey,
    o.o_custkey,
    o.o_orderdate,
    count(*) as line_count,
    sum(l.net_price) as revenue
from {{ source('tpch', 'orders') }} as o
inner join {{ ref('stg_lineitem') }} as l
    on l.l_orderkey = o.o_orderkey
group by o.o_orderkey, o.o_custkey, o.o_orderdate
