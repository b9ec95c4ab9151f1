-- Level 3 of the example chain: revenue per nation, joining order_revenue (a consistent_stream
-- model) with customer and nation read directly from the sources. Every version reflects one
-- cut of lineitem, orders, customer and nation: order_revenue's version and the sources'
-- versions agree (docs/guides/ref-chains.md).
{{ config(unique_key='n_name') }}

select
    n.n_name,
    count(*) as order_count,
    count(distinct c.c_custkey) as customer_count,
    sum(r.revenue) as revenue
from {{ ref('order_revenue') }} as r
inner join {{ source('tpch', 'customer') }} as c
    on c.c_custkey = r.o_custkey
inner join {{ source('tpch', 'nation') }} as n
    on n.n_nationkey = c.c_nationkey
group by n.n_name
