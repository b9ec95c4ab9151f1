-- TPC-H Q11: important stock identification
select
    ps_partkey,
    sum(ps_supplycost * ps_availqty) as value
from
    {{ source('tpch', 'partsupp') }},
    {{ source('tpch', 'supplier') }},
    {{ source('tpch', 'nation') }}
where
    ps_suppkey = s_suppkey
    and s_nationkey = n_nationkey
    and n_name = 'GERMANY'
group by
    ps_partkey having
        sum(ps_supplycost * ps_availqty) > (
            select
                sum(ps_supplycost * ps_availqty) * 0.0001000000
            from
                {{ source('tpch', 'partsupp') }},
                {{ source('tpch', 'supplier') }},
                {{ source('tpch', 'nation') }}
            where
                ps_suppkey = s_suppkey
                and s_nationkey = n_nationkey
                and n_name = 'GERMANY'
        )
order by
    value desc
