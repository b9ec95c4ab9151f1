-- TPC-H Q1 (pricing summary report), without ORDER BY, plus the shipping date range per group.
{{ config(unique_key=['l_returnflag', 'l_linestatus']) }}

select
    l_returnflag,
    l_linestatus,
    sum(l_quantity) as sum_qty,
    sum(l_extendedprice) as sum_base_price,
    sum(l_extendedprice * (1 - l_discount)) as sum_disc_price,
    sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) as sum_charge,
    avg(l_quantity) as avg_qty,
    avg(l_extendedprice) as avg_price,
    avg(l_discount) as avg_disc,
    count(*) as count_order,
    min(l_shipdate) as min_shipdate,
    max(l_shipdate) as max_shipdate
from {{ source('tpch', 'lineitem') }}
where l_shipdate <= date '1998-09-02'
group by l_returnflag, l_linestatus
