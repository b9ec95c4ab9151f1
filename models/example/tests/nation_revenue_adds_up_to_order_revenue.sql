-- The mart and the intermediate model agree after every run: nation_revenue reads
-- order_revenue's newest version, and every order's customer has a nation, so the revenue
-- per nation adds up to the revenue of all orders. Returns a row when it does not.
select n.total as nation_total, o.total as order_total
from (select sum(revenue) as total from {{ ref('nation_revenue') }}) as n
cross join (select sum(revenue) as total from {{ ref('order_revenue') }}) as o
where n.total <> o.total
