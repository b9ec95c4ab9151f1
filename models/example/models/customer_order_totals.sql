-- Every customer with its number of orders and their total price; customers without orders
-- have 0 and 0 (the LEFT JOIN's null-padded row, retracted when the first order arrives).
{{ config(unique_key='c_custkey') }}

with order_totals as (
    select
        o_custkey,
        count(*) as order_count,
        sum(o_totalprice) as total
    from {{ source('tpch', 'orders') }}
    group by o_custkey
)

select
    c.c_custkey,
    c.c_name,
    coalesce(t.order_count, 0) as order_count,
    coalesce(t.total, 0) as total_price
from {{ source('tpch', 'customer') }} as c
left join order_totals as t
    on c.c_custkey = t.o_custkey
