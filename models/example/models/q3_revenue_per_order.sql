-- TPC-H Q3 (shipping priority), without ORDER BY/LIMIT: unshipped revenue per order of the
-- BUILDING segment, kept up to date as customers, orders and line items change.
{{ config(unique_key='l_orderkey') }}

select
    l.l_orderkey,
    o.o_orderdate,
    o.o_shippriority,
    sum(l.l_extendedprice * (1 - l.l_discount)) as revenue
from {{ source('tpch', 'customer') }} as c
inner join {{ source('tpch', 'orders') }} as o
    on c.c_custkey = o.o_custkey
inner join {{ source('tpch', 'lineitem') }} as l
    on l.l_orderkey = o.o_orderkey
where c.c_mktsegment = 'BUILDING'
    and o.o_orderdate < date '1995-03-15'
    and l.l_shipdate > date '1995-03-15'
group by l.l_orderkey, o.o_orderdate, o.o_shippriority
